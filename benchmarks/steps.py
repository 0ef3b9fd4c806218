"""Optimiser steps per second of the trainer, before and after a change, in one invocation.

Two runs of the quick negatives study (``crl study negatives --preset quick``): its largest pycode
run (GCL over an embedding-bag tower on 2,000 docstring/code pairs, independent negative sets of
m = 800 = 0.4 n, batch 128) and its largest digits run (a small shared CNN on two augmented views
of 1,200 images, the same loss, m = 480 = 0.4 n). Each measurement is a fresh process of one
tree's Python: it builds the run, then times ``warmup + steps`` optimiser steps of the trainer's
own ``train_step`` on the trainer's DataLoader (data loading, the towers, the loss, backward and
the update; no evaluation or checkpoint). The two trees alternate (before, after, after, before,
...) so that a change in the machine's load hits both alike; the ratio after / before is taken
within each adjacent pair.

Writes ``runs/bench/steps.json`` by default. Run from the repository root:

    .venv/bin/python benchmarks/steps.py --before /tmp/base --out benchmarks/results/steps.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]

#: The run configs (as the quick negatives study builds them; written out, so both trees run the
#: same config whatever their study code).
CASES: dict[str, dict[str, Any]] = {
    "pycode": {
        "data": {"name": "pycode", "num_train": 2000, "seed": 0, "val_fraction": 0.0},
        "model": {"kind": "embedding_bag", "embed_dim": 128, "token_dim": 64, "head": "linear"},
        "negatives": {"regime": "independent", "m": 800, "seed": 0},
    },
    "digits": {
        "data": {"name": "digits", "num_train": 1200, "seed": 0, "val_fraction": 0.0},
        "model": {"kind": "cnn", "embed_dim": 64, "hidden_dim": 128, "shared_tower": True},
        "negatives": {"regime": "independent", "m": 480, "seed": 0},
    },
}
COMMON: dict[str, Any] = {
    "loss": {"name": "gcl", "temperature": 0.05, "gcl": {"gamma": 0.9,
                                                        "gamma_schedule": "constant"}},
    "optim": {"name": "adamw", "lr": 5e-3, "weight_decay": 1e-4, "warmup_steps": 9},
    "train": {"seed": 0, "batch_size": 128, "steps": 200, "num_threads": 1},
    "eval": {"probe": False, "geometry": False},
}


def _config(case: str) -> dict[str, Any]:
    return {**COMMON, **CASES[case]}


def worker(case: str, steps: int, warmup: int) -> dict[str, Any]:
    """Time ``steps`` optimiser steps after ``warmup`` (in this process's crl)."""
    import torch
    from torch.optim.lr_scheduler import LambdaLR
    from torch.utils.data import DataLoader
    from torch.utils.data._utils.collate import default_collate

    import crl
    from crl.train import build_run, epoch_permutation, train_step, validate_config
    from crl.train.build import build_optimizer, lr_factor

    config = validate_config(_config(case), f"benchmark {case}")
    torch.set_num_threads(config.train.num_threads or 1)
    device = torch.device("cpu")
    built = build_run(config, device)
    params = list({id(p): p for m in (built.model, built.objective)
                   for p in m.parameters() if p.requires_grad}.values())
    optimizer = build_optimizer(config.optim, params)
    total = built.total_steps
    scheduler = LambdaLR(optimizer, lambda s: lr_factor(s, total, config.optim))
    size = config.train.batch_size
    order = epoch_permutation(len(built.train_ds), config.train.seed, 0)
    batches = [order[i * size:(i + 1) * size].tolist() for i in range(built.steps_per_epoch)]
    batches = (batches * (1 + (warmup + steps) // len(batches)))[:warmup + steps]
    loader = DataLoader(built.train_ds, batch_sampler=batches, collate_fn=default_collate)
    built.model.train()
    times: list[float] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    for step, batch in enumerate(loader):
        if step == warmup:
            started, cpu_started = time.perf_counter(), time.process_time()
        t0 = time.perf_counter()
        train_step(built.model, built.objective, batch, optimizer, scheduler, grad_clip=None,
                   step=step, device=device)
        times.append(time.perf_counter() - t0)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {"case": case, "crl": str(Path(crl.__file__).parent), "steps": steps,
            "steps_per_second": steps / elapsed, "steps_per_cpu_second": steps / cpu,
            "median_step_s": statistics.median(
                times[warmup:]), "cpu_count": os.cpu_count()}


def _commit(tree: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _measure(python: Path, tree: Path, case: str, steps: int, warmup: int) -> dict[str, Any]:
    load_before = os.getloadavg()
    out = subprocess.run([str(python), str(HERE), "--worker", case, "--steps", str(steps),
                          "--warmup", str(warmup)], cwd=tree, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
                         timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: {case} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["load_before"], result["load_after"] = load_before, os.getloadavg()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, default=Path("/tmp/base"),
                        help="the tree of the code before (with its own .venv)")
    parser.add_argument("--after", type=Path, default=ROOT, help="the tree of the code after")
    parser.add_argument("--cases", default="pycode,digits")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="pairs of measurements per case")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "steps.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.warmup)))
        return
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    rows: dict[str, Any] = {}
    for case in args.cases.split(","):
        runs: list[dict[str, Any]] = []
        for repeat in range(args.repeats):
            order = ("before", "after") if repeat % 2 == 0 else ("after", "before")
            pair = {}
            for which in order:
                tree = trees[which]
                pair[which] = _measure(tree / ".venv" / "bin" / "python", tree, case,
                                       args.steps, args.warmup)
                print(f"{case} {which}: {pair[which]['steps_per_second']:.2f} steps/s, "
                      f"{pair[which]['steps_per_cpu_second']:.2f} per CPU s "
                      f"(load {pair[which]['load_before'][0]:.1f})", file=sys.stderr)
            runs.append({**pair, "ratio_after_vs_before": pair["after"]["steps_per_second"]
                         / pair["before"]["steps_per_second"],
                         "cpu_ratio_after_vs_before": pair["after"]["steps_per_cpu_second"]
                         / pair["before"]["steps_per_cpu_second"]})
        ratios = [r["ratio_after_vs_before"] for r in runs]
        cpu_ratios = [r["cpu_ratio_after_vs_before"] for r in runs]
        rows[case] = {
            "config": _config(case), "pairs": runs,
            "before_steps_per_second": [r["before"]["steps_per_second"] for r in runs],
            "after_steps_per_second": [r["after"]["steps_per_second"] for r in runs],
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "cpu_ratio_median": statistics.median(cpu_ratios),
            "cpu_ratio_min": min(cpu_ratios), "cpu_ratio_max": max(cpu_ratios)}
    result = {"benchmark": "optimiser steps per second, before vs after",
              "before": {"tree": str(trees["before"]), "commit": _commit(trees["before"])},
              "after": {"tree": str(trees["after"]), "commit": _commit(trees["after"])},
              "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
              "threads": 1, "cases": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for case, row in rows.items():
        print(f"{case}: after/before = {row['ratio_median']:.2f} "
              f"(range {row['ratio_min']:.2f}-{row['ratio_max']:.2f}, {args.repeats} pairs); "
              f"per CPU second {row['cpu_ratio_median']:.2f} "
              f"({row['cpu_ratio_min']:.2f}-{row['cpu_ratio_max']:.2f})")


if __name__ == "__main__":
    main()
