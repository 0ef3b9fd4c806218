"""What one rank's loss costs in distributed training: its rows against all gathered columns.

Under ``torchrun`` with ``N`` ranks, each rank calls the trainer's ``Objective`` on the gathered
``(B, D)`` batch with ``rows = own_rows(B)``: ``B / N`` anchors in each direction against all
``B`` candidates (docs/distributed.md). This times that call, forward and backward, against the
whole-batch call of one process, in one process on the same inputs (the loss's work does not
depend on the process group; the all-gathers are not timed). Expected: about ``1 / N`` of the
whole batch's time.

Writes ``runs/bench/distributed.json`` (``--out benchmarks/results/distributed.json`` to record
a new measurement in the repository). Run from the repository root:

    .venv/bin/python benchmarks/distributed.py [--batch-sizes 4096,8192] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from crl import distributed
from crl.bench._measure import best_time
from crl.env import environment_info
from crl.losses import build_objective
from crl.negatives import NegativesConfig
from crl.rundir import write_json
from crl.train.config import LossConfig

RESULTS = Path(__file__).resolve().parents[1] / "runs" / "bench" / "distributed.json"


def _time(loss: dict[str, Any], negatives: dict[str, Any], batch: int, dim: int,
          rows: slice | None) -> tuple[float, float]:
    """Best-of-3 seconds of forward + backward, and the loss value."""
    gen = torch.Generator().manual_seed(0)
    za = F.normalize(torch.randn(batch, dim, generator=gen), dim=1).requires_grad_(True)
    zb = F.normalize(za.detach() + 1.5 * torch.randn(batch, dim, generator=gen),
                     dim=1).requires_grad_(True)
    index = torch.randperm(batch, generator=gen)
    objective = build_objective(LossConfig(**loss), NegativesConfig(**negatives),
                                num_samples=batch)  # CLIP: logit scale log(1 / 0.07) inside
    values: list[float] = []

    def step() -> None:
        za.grad = zb.grad = None
        value, _ = objective(za, zb, index, None, rows=rows)
        value.backward()  # type: ignore[no-untyped-call]
        values.append(float(value.detach()))

    seconds, _ = best_time(step, 3, 1)
    return seconds, values[-1]


CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "clip (tiled)": ({"name": "clip", "block_size": 2048}, {}),
    "gcl, independent sets m = n/10 (tiled)": (
        {"name": "gcl", "temperature": 0.1, "block_size": 2048}, {"regime": "independent"}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="4096,8192")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    ranks = [int(r) for r in args.ranks.split(",")]
    rows_out: list[dict[str, Any]] = []
    started = time.time()
    for name, (loss, negatives) in CASES.items():
        for batch in batches:
            neg = {**negatives, "m": batch // 10} if negatives else negatives
            whole, _ = _time(loss, neg, batch, args.dim, None)
            row: dict[str, Any] = {"loss": name, "batch": batch, "dim": args.dim,
                                   "whole_batch_seconds": round(whole, 4)}
            for world in ranks:
                share, _ = _time(loss, neg, batch, args.dim,
                                 distributed.own_rows(batch, 0, world))
                row[f"rank_share_seconds_N{world}"] = round(share, 4)
                row[f"ratio_N{world}"] = round(share / whole, 3)
            print(json.dumps(row), flush=True)
            rows_out.append(row)
    result = {"benchmark": "distributed loss share per rank", "threads": args.threads,
              "rows": rows_out, "wall_seconds": round(time.time() - started, 1),
              "environment": environment_info()}
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
