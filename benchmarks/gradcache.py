"""Gradient caching at bounded memory: a MiniLM fine-tuning step at B = 1,024 in micro-batches of
32, against the one-pass step at the largest B that fits.

The model is ``model.kind: transformer`` with the bundled all-MiniLM-L6-v2 weights (one shared
tower, mean pooling, ``max_seq_length`` 128), the CLIP loss, AdamW; the pairs are deterministic
texts of about 60 (view a) and 90 (view b) word pieces. Each measurement is a fresh process that
builds the model, runs one small warm-up step, then times one full optimiser step
(``crl.train.train_step``) and reads its peak resident memory (``VmHWM``) against the
resident memory just before the step. One-pass steps run at increasing B and stop before the
one whose predicted peak (a line through the previous two) would exceed ``--memory-gib``.

Writes ``runs/bench/gradcache.json`` by default. Run from the repository root:

    .venv/bin/python benchmarks/gradcache.py --out benchmarks/results/gradcache.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
WORDS = ("def return value list dict key item sort read write file open close path name index "
         "count sum total number string text line split join strip format print error raise "
         "self class method call args kwargs result data batch model train loss step").split()


def _texts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


def _rss_gib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def worker(batch: int, micro: int | None, threads: int) -> dict[str, Any]:
    """One timed optimiser step at ``batch`` (gradient caching with ``micro`` if given)."""
    import torch

    from crl.data.base import DataInfo, TextPairDataset
    from crl.models import build_model
    from crl.train import train_step
    from crl.train.build import build_optimizer, run_objective, trainable
    from crl.train.config import TrainConfig

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = TrainConfig.model_validate({
        "data": {"name": "pycode"},
        "model": {"kind": "transformer", "max_seq_length": 128},
        "loss": {"name": "clip"}, "optim": {"name": "adamw", "lr": 2e-5},
        "train": {"batch_size": max(batch, 2), "micro_batch_size": micro}})
    info = DataInfo(kind="text", dim_a=None, dim_b=None, image_shape=None, num_classes=None,
                    name="texts")
    model = build_model(config.model, info)
    data = model.prepare(TextPairDataset(_texts(batch, 40, 1), _texts(batch, 60, 2)))
    xa, xb = data.eval_views()
    objective = run_objective(config, num_samples=batch, labels=None, epochs=1,
                              num_classes=None)
    optimizer = build_optimizer(config.optim, trainable([model, objective]))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    device = torch.device("cpu")
    model.train()

    def step(rows: slice, k: int | None) -> float:
        size = rows.stop - rows.start
        value, _ = train_step(model, objective, (xa[rows], xb[rows], torch.arange(size),
                                                 torch.full((size,), -1)),
                              optimizer, scheduler, grad_clip=None, step=0, device=device,
                              micro_batch_size=k)
        return value

    step(slice(0, 2), None)  # warm-up: lazy allocations, the optimiser's state
    before = _rss_gib("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    loss = step(slice(0, batch), micro)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    peak = _rss_gib("VmHWM")
    return {"batch_size": batch, "micro_batch_size": micro, "seconds": seconds,
            "cpu_seconds": cpu_seconds, "loss": loss,
            "rss_before_gib": before, "peak_rss_gib": peak,
            "peak_above_before_gib": peak - before, "tokens": int(xa[:, 1].sum() + xb[:, 1].sum())}


def _measure(batch: int, micro: int | None, threads: int) -> dict[str, Any]:
    load = os.getloadavg()
    args = [sys.executable, str(HERE), "--worker", str(batch), "--threads", str(threads)]
    if micro is not None:
        args += ["--micro", str(micro)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=3600,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS":
                              str(threads)})
    if out.returncode != 0:
        raise RuntimeError(f"B={batch} k={micro}: {out.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    row["load_before"], row["load_after"] = load, os.getloadavg()
    print(f"B={batch} k={micro}: {row['seconds']:.1f} s, peak +{row['peak_above_before_gib']:.2f}"
          f" GiB", file=sys.stderr)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--plain-batch-sizes", default="32,64,128,256,512,1024")
    parser.add_argument("--memory-gib", type=float, default=4.0,
                        help="the memory a step may take above the model's (what 'fits')")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on a loaded 2-core machine 2 threads ran a "
                             "small step 5x slower)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "gradcache.json")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--micro", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.micro, args.threads)))
        return
    plain: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for batch in (int(b) for b in args.plain_batch_sizes.split(",")):
        if len(plain) >= 2:  # a line through the last two peaks predicts this one
            (b0, m0), (b1, m1) = [(r["batch_size"], r["peak_above_before_gib"])
                                  for r in plain[-2:]]
            predicted = m1 + (m1 - m0) / (b1 - b0) * (batch - b1)
            if predicted > args.memory_gib:
                skipped.append({"batch_size": batch, "predicted_peak_above_gib": predicted})
                break
        plain.append(_measure(batch, None, args.threads))
    cached = _measure(args.batch_size, args.micro_batch_size, args.threads)
    largest = plain[-1]
    result = {
        "benchmark": "MiniLM fine-tuning step: gradient caching vs one pass",
        "memory_budget_gib": args.memory_gib, "threads": args.threads,
        "one_pass": plain, "not_run": skipped, "cached": cached,
        "largest_one_pass_batch": largest["batch_size"],
        "batch_ratio_cached_vs_largest_one_pass": cached["batch_size"] / largest["batch_size"],
        "memory_ratio_cached_vs_largest_one_pass":
            cached["peak_above_before_gib"] / largest["peak_above_before_gib"],
        "seconds_per_pair_cached": cached["seconds"] / cached["batch_size"],
        "seconds_per_pair_largest_one_pass": largest["seconds"] / largest["batch_size"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, (list, dict))},
                     indent=2))


if __name__ == "__main__":
    main()
