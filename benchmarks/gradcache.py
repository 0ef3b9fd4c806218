"""Gradient caching beside sentence-transformers: one MiniLM fine-tuning step of crl
(``train.micro_batch_size`` / ``train.micro_batch_tokens`` / ``train.precision: bf16``) and of
sentence-transformers' ``CachedMultipleNegativesRankingLoss`` on the same real pairs.

Both fine-tune the bundled all-MiniLM-L6-v2 (one shared tower, mean pooling, ``max_seq_length``
128, float32 unless an entry says bf16) with AdamW (lr 2e-5) on the first ``B`` training pairs
of pycode (``data.name: pycode``: a docstring's first paragraph and its function's code), the
same ``B`` and micro-batch size. crl's loss is the CLIP loss (both directions, learnt scale);
the peer's is MNRL (one direction, scale 20): at these B the loss is well under 1% of a step.

Each entry is a fresh process with ``--threads`` torch threads. It tokenises the batch (timed
apart: crl does it once per data set in ``DualEncoder.prepare``, sentence-transformers per
batch in its collator), runs a warm-up step on the first ``2 k`` pairs through the same code
(the optimiser's state, lazy allocations), then returns the freed memory to the system
(``malloc_trim``) and resets the peak (``/proc/self/clear_refs``) before a step on all ``B``
pairs (the loss, the backward pass and the optimiser step): its peak memory is ``VmHWM`` after
it minus ``VmRSS`` before it. The step after that, on memory the process holds as any later
training step does, is the one timed (``cold_seconds``: the memory step's time). Entries run
back to back, each with the machine's load average before and after.

Run from the repository root (about two minutes per entry at B = 256 and eight at B = 1,024
on an idle machine):

    .venv/bin/python benchmarks/gradcache.py --batch-size 256 \
        --out benchmarks/results/gradcache.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
#: Every finished entry's row is appended here too, so a long run that is stopped keeps them.
ROWS_LOG = ROOT / "runs" / "bench" / "gradcache_rows.jsonl"
MAX_SEQ_LENGTH = 128
LR = 2e-5
#: name -> (tool, micro-batch tokens or None, precision)
ENTRIES: dict[str, tuple[str, int | None, str]] = {
    "crl": ("crl", None, "fp32"),
    "sentence-transformers": ("st", None, "fp32"),
    "crl tokens": ("crl", 4096, "fp32"),
    "crl bf16": ("crl", None, "bf16"),
    "crl tokens bf16": ("crl", 4096, "bf16"),
    "sentence-transformers tokens": ("st", 4096, "fp32"),
}


def _status_gib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _pairs(batch: int) -> tuple[list[str], list[str]]:
    from crl.data.config import DataConfig
    from crl.data.load import load_data

    train = load_data(DataConfig(name="pycode", num_train=batch), progress=False).train
    return list(train.a[:batch]), list(train.b[:batch])


def _crl_stepper(a: list[str], b: list[str], micro: int, tokens: int | None,
                 precision: str) -> tuple[Any, float]:
    """crl's step on rows ``[0, n)`` of the prepared pairs, and the tokenising time."""
    import torch

    from crl.data.base import DataInfo, TextPairDataset
    from crl.models import build_model
    from crl.train import train_step
    from crl.train.build import build_optimizer, run_objective, trainable
    from crl.train.config import TrainConfig

    train: dict[str, Any] = {"batch_size": len(a), "precision": precision}
    by_tokens = {"micro_batch_tokens": tokens} if tokens else {}  # (older crl has no such key)
    train.update(by_tokens or {"micro_batch_size": micro})
    config = TrainConfig.model_validate({
        "data": {"name": "pycode"},
        "model": {"kind": "transformer", "max_seq_length": MAX_SEQ_LENGTH, "pooling": "mean"},
        # bf16: the loss in tiles, so the embeddings reach the exact kernel in bfloat16
        "loss": {"name": "clip", **({"block_size": 128} if precision == "bf16" else {})},
        "optim": {"name": "adamw", "lr": LR}, "train": train})
    info = DataInfo(kind="text", dim_a=None, dim_b=None, image_shape=None, num_classes=None,
                    name="texts")
    model = build_model(config.model, info)
    t0 = time.perf_counter()
    xa, xb = model.prepare(TextPairDataset(a, b)).eval_views()
    tokenize = time.perf_counter() - t0
    objective = run_objective(config, num_samples=len(a), labels=None, epochs=1,
                              num_classes=None)
    optimizer = build_optimizer(config.optim, trainable([model, objective]))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    model.train()

    def step(n: int) -> float:
        value, _ = train_step(model, objective, (xa[:n], xb[:n], torch.arange(n),
                                                 torch.full((n,), -1)),
                              optimizer, scheduler, grad_clip=None, step=0,
                              device=torch.device("cpu"),
                              micro_batch_size=config.train.micro_batch_size, precision=precision,
                              **by_tokens)
        return value

    return step, tokenize


def _st_stepper(a: list[str], b: list[str], micro: int, tokens: int | None,
                precision: str) -> tuple[Any, float]:
    """sentence-transformers' step on pairs ``[0, n)``, and the tokenising time."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
    )

    from crl.models.text import minilm_model_dir

    if precision != "fp32":
        raise SystemExit("the sentence-transformers entries run in fp32")
    model = SentenceTransformer(str(minilm_model_dir()), device="cpu")
    model.max_seq_length = MAX_SEQ_LENGTH
    loss_fn = CachedMultipleNegativesRankingLoss(model, mini_batch_size=micro,
                                                 mini_batch_num_tokens=tokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model.train()
    t0 = time.perf_counter()
    fa, fb = model.tokenize(a), model.tokenize(b)
    tokenize = time.perf_counter() - t0

    def step(n: int) -> float:
        features = [{k: v[:n] for k, v in f.items()} for f in (fa, fb)]
        loss = loss_fn(features, None)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step, tokenize


def worker(name: str, batch: int, micro: int, threads: int) -> dict[str, Any]:
    """One entry (:data:`ENTRIES`): the timed second step at ``batch``."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    tool, tokens, precision = ENTRIES[name]
    a, b = _pairs(batch)
    make = _crl_stepper if tool == "crl" else _st_stepper
    step, tokenize = make(a, b, micro, tokens, precision)
    step(min(2 * micro, batch))  # the first step: warm-up
    # The memory step: the warm-up's freed blocks go back to the system first (glibc keeps
    # them otherwise, and how many it kept, not the step, decided the peak's growth: 0.19 to
    # 0.55 GiB for the same entry in three runs), so the growth is what a step of B needs.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status_gib("VmRSS")
    t0 = time.perf_counter()
    step(batch)
    cold_seconds = time.perf_counter() - t0
    peak = _status_gib("VmHWM")
    # The timed step: the next one at B, on memory the process already holds (as every step
    # of a training run after its first)
    t0, c0 = time.perf_counter(), time.process_time()
    loss = step(batch)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    return {"entry": name, "tool": tool, "batch_size": batch, "micro_batch_size": micro,
            "micro_batch_tokens": tokens, "precision": precision, "threads": threads,
            "seconds": seconds, "cpu_seconds": cpu_seconds, "cold_seconds": cold_seconds,
            "tokenize_seconds": tokenize, "loss": loss, "rss_before_gib": before,
            "peak_above_before_gib": peak - before}


def measure(name: str, batch: int, micro: int, threads: int,
            src: Path | None = None) -> dict[str, Any]:
    """One entry in a fresh process (``src``: the crl source tree it imports)."""
    load = os.getloadavg()
    args = [sys.executable, str(HERE), "--worker", name, "--batch-size", str(batch),
            "--micro-batch-size", str(micro), "--threads", str(threads)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false"}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    out = subprocess.run(args, capture_output=True, text=True, timeout=3600, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{name} B={batch}: {out.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    row["load_before"], row["load_after"] = load, os.getloadavg()
    if src is not None:
        row["crl_source"] = str(src)
    print(f"{name} B={batch}: {row['seconds']:.1f} s, +{row['peak_above_before_gib']:.2f} GiB "
          f"(load {load[0]:.1f} -> {row['load_after'][0]:.1f})", file=sys.stderr)
    return row


def ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each crl entry's time and peak memory over the fp32 sentence-transformers entry's at
    the same B (the last measured)."""
    out: dict[str, dict[str, float]] = {}
    peers = {r["batch_size"]: r for r in rows if r["entry"] == "sentence-transformers"}
    for r in rows:
        peer = peers.get(r["batch_size"])
        if peer is None or r["tool"] != "crl":
            continue
        label = r["entry"] + (" (" + r["crl_source"] + ")" if "crl_source" in r else "")
        out[f"{label} B={r['batch_size']}"] = {
            "time_ratio": r["seconds"] / peer["seconds"],
            "memory_ratio": r["peak_above_before_gib"] / peer["peak_above_before_gib"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--entries", default="crl,sentence-transformers,crl tokens,crl bf16",
                        help=f"comma-separated, of: {', '.join(ENTRIES)}")
    parser.add_argument("--before", type=Path, default=None,
                        help="also run the 'crl' entry from this crl source tree (e.g. an "
                             "older checkout's src)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--append", action="store_true", help="add to --out's rows")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "gradcache.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        row = worker(args.worker, args.batch_size, args.micro_batch_size, args.threads)
        ROWS_LOG.parent.mkdir(parents=True, exist_ok=True)
        with ROWS_LOG.open("a") as log:
            log.write(json.dumps({**row, "loadavg_end": os.getloadavg()}) + "\n")
        print(json.dumps(row))
        return
    names = [n.strip() for n in args.entries.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENTRIES]
    if unknown:
        parser.error(f"--entries: unknown {unknown}; expected some of {list(ENTRIES)}")
    rows: list[dict[str, Any]] = []
    if args.append and args.out.is_file():
        rows = json.loads(args.out.read_text())["rows"]
    if args.before is not None:
        rows.append(measure("crl", args.batch_size, args.micro_batch_size, args.threads,
                            args.before.resolve()))
    for name in names:
        rows.append(measure(name, args.batch_size, args.micro_batch_size, args.threads))
    result = {"benchmark": "MiniLM step with gradient caching: crl beside sentence-transformers"
                           " CachedMultipleNegativesRankingLoss (pycode pairs, second step)",
              "max_seq_length": MAX_SEQ_LENGTH, "rows": rows, "ratios": ratios(rows)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["ratios"], indent=2))


if __name__ == "__main__":
    main()
