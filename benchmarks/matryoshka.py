"""Training-time overhead of ``loss.matryoshka``: the time of an optimiser step with and without
the Matryoshka prefixes, on the same model and batches, measured in the same run.

Two tiny models bracket the overhead: an ``mlp`` dual encoder on synthetic features (the towers
cost little, so the loss's share of the step, which the prefixes repeat, is large: an upper
bound) and the tests' 2-layer BERT of width 32 fine-tuned end to end on short texts (the towers
dominate, as for a real encoder). Steps with and without the prefixes alternate in rounds, so
load on the machine hits both alike; the ratio of the median step times is reported with the
load average.

    PYTHONPATH=src:tests .venv/bin/python benchmarks/matryoshka.py [--rounds 5] [--steps 5]

Writes ``OUT/matryoshka.json`` (``--out``, default ``runs/bench``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from crl.bench._measure import machine_state
from crl.data.base import DataInfo, TextPairDataset
from crl.models import build_model
from crl.rundir import write_json
from crl.train.build import build_optimizer, run_objective, trainable
from crl.train.config import TrainConfig
from crl.train.steps import train_step

CPU = torch.device("cpu")
WORDS = "add two numbers return the sum of a list sort items by key read write file".split()


def _stepper(model_cfg: dict[str, Any], info: DataInfo, batch: tuple, embed_dim: int,
             dims: list[int] | None) -> Callable[[], None]:
    """One optimiser step on ``batch`` per call, for a fresh model (seed 0)."""
    loss: dict[str, Any] = {"name": "clip"}
    if dims is not None:
        loss["matryoshka"] = {"dims": dims}
    cfg = TrainConfig.model_validate({"model": {**model_cfg, "embed_dim": embed_dim},
                                      "loss": loss})
    torch.manual_seed(0)
    model = build_model(cfg.model, info)
    objective = run_objective(cfg, num_samples=batch[2].numel(), labels=None, epochs=1,
                              num_classes=None)
    optimizer = build_optimizer(cfg.optim, trainable([model, objective]))
    scheduler = LambdaLR(optimizer, lambda s: 1.0)
    prepared = batch
    if info.kind == "text":
        xa, xb = model.prepare(TextPairDataset(*batch[:2])).eval_views()
        prepared = (xa, xb, batch[2], batch[3])

    def step() -> None:
        train_step(model, objective, prepared, optimizer, scheduler, grad_clip=None, step=0,
                   device=CPU)

    return step


def _compare(plain: Callable[[], None], nested: Callable[[], None], rounds: int,
             steps: int) -> dict[str, Any]:
    """Median seconds per step of each, in alternating rounds of ``steps`` steps."""
    plain(), nested()  # warm-up
    times: dict[str, list[float]] = {"plain": [], "matryoshka": []}
    for _ in range(rounds):
        for name, fn in (("plain", plain), ("matryoshka", nested)):
            for _ in range(steps):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"median_step_s": medians, "ratio": medians["matryoshka"] / medians["plain"],
            "steps_each": rounds * steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs") / "bench")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    before = machine_state()
    results: dict[str, Any] = {}

    g = torch.Generator().manual_seed(0)
    b, d = 256, 64
    features = (torch.randn(b, d, generator=g), torch.randn(b, d, generator=g),
                torch.arange(b), torch.full((b,), -1))
    info = DataInfo(kind="vector", dim_a=d, dim_b=d, image_shape=None, num_classes=None,
                    name="synthetic")
    mlp = {"kind": "mlp", "hidden_dim": 128}
    dims = [128, 64, 32, 16]
    results["mlp"] = {"batch": b, "embed_dim": 128, "dims": dims, **_compare(
        _stepper(mlp, info, features, 128, None), _stepper(mlp, info, features, 128, dims),
        args.rounds, args.steps)}

    from tiny_bert import write_tiny_bert  # tests/tiny_bert.py (PYTHONPATH includes tests)

    with tempfile.TemporaryDirectory() as tmp:
        bert = {"kind": "transformer", "pretrained": str(write_tiny_bert(Path(tmp) / "bert")),
                "max_seq_length": 16}
        rng = torch.Generator().manual_seed(1)
        texts = [" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (4,), generator=rng))
                 for _ in range(2 * 32)]
        pairs = (texts[:32], texts[32:], torch.arange(32), torch.full((32,), -1))
        text = DataInfo(kind="text", dim_a=None, dim_b=None, image_shape=None,
                        num_classes=None, name="texts")
        dims = [32, 16, 8, 4]
        results["tiny_bert"] = {"batch": 32, "embed_dim": 32, "dims": dims, **_compare(
            _stepper(bert, text, pairs, 32, None), _stepper(bert, text, pairs, 32, dims),
            args.rounds, args.steps)}
    out = {"results": results, "machine_before": before, "machine_after": machine_state(),
           "threads": args.threads}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "matryoshka.json", out)
    for name, value in results.items():
        print(f"{name}: plain {value['median_step_s']['plain'] * 1e3:.2f} ms, matryoshka "
              f"{value['median_step_s']['matryoshka'] * 1e3:.2f} ms per step, ratio "
              f"{value['ratio']:.3f} ({len(value['dims'])} prefixes)")
    print("load average before / after:", before["loadavg_1_5_15min"],
          out["machine_after"]["loadavg_1_5_15min"])


if __name__ == "__main__":
    main()
