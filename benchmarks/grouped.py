"""Runs per CPU-second: one run per process (``fit``) against grouped training (``fit_group``).

The runs are those of one ``(n, seed)`` cell of the quick negatives study (``crl study negatives
--preset quick``, pycode, GCL over an embedding-bag tower, batch 128, 12,000 samples): every
distinct (m, regime) run of the cell (9 at n = 500: m = 5, 25, 50, 200 in both regimes and m = n
once). Each measurement is a fresh child process; its CPU time (user + system, from
``resource.getrusage(RUSAGE_CHILDREN)``, so the tokenizer's threads count too) is what a study
pays. "one per process" starts one child per run (import, data, tokenising, training,
evaluation, as a study worker that takes one run); "sequential" starts one child that fits the
cell's runs one after the other (as a worker of the study's process pool that is handed them:
import and tokeniser caches warm); "grouped" starts one child that trains the whole cell with
``fit_group``, batched (one forward of the stacked towers) or separate (each run's towers on
their own; the process, data and batches shared). The machine is shared, so
CPU seconds (not wall-clock) are compared and the load average is recorded. The summaries of
the paths are compared (to 1e-6).

    .venv/bin/python benchmarks/grouped.py --out benchmarks/results/grouped.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()

CHILD = r"""
import json, sys, torch
from crl.experiments.negatives import NegativesStudy
from crl.train import fit, fit_group, validate_config
torch.set_num_threads(1)
mode, n, seed, out, which = sys.argv[1:6]
n, seed = int(n), int(seed)
specs = {s.run_id: s for s in NegativesStudy("quick").runs()
         if s.tags["n"] == n and s.tags["seed"] == seed and "stage" not in s.tags}
specs = [specs[k] for k in sorted(specs)]
if which != "all":
    specs = [specs[int(i)] for i in which.split(",")]
configs = [validate_config(s.config) for s in specs]
dirs = [f"{out}/{s.run_id}" for s in specs]
if mode in ("batched", "separate"):
    results = fit_group(configs, dirs, batched=mode == "batched")
else:
    results = [fit(c, d, progress=False) for c, d in zip(configs, dirs)]
print(json.dumps({s.run_id: r.summary for s, r in zip(specs, results)}))
"""


def _child(mode: str, n: int, seed: int, which: str) -> tuple[float, float, dict[str, Any]]:
    """CPU seconds and wall seconds of one child, and the summaries it printed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-c", CHILD, mode, str(n), str(seed), out, which],
                              capture_output=True, text=True, check=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alone", default="0,4,8",
                        help="Indices (in run-id order) of the cell's runs timed one per process")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/grouped.json"))
    args = parser.parse_args()
    load = [os.getloadavg()[0]]
    alone_cpu, alone_wall, alone = [], [], {}
    for index in args.alone.split(","):
        cpu, wall, summaries = _child("alone", args.n, args.seed, index)
        alone_cpu.append(cpu)
        alone_wall.append(wall)
        alone.update(summaries)
        load.append(os.getloadavg()[0])
    result: dict[str, Any] = {
        "cell": {"n": args.n, "seed": args.seed, "runs_timed_alone": len(alone_cpu)},
        "one_per_process": {"cpu_s": alone_cpu, "wall_s": alone_wall,
                            "cpu_s_per_run": sum(alone_cpu) / len(alone_cpu)},
    }
    per_alone = result["one_per_process"]["cpu_s_per_run"]
    result["one_per_process"]["runs_per_cpu_s"] = 1 / per_alone
    for mode in ("sequential", "batched", "separate"):
        cpu, wall, grouped = _child(mode, args.n, args.seed, "all")
        load.append(os.getloadavg()[0])
        worst = max(abs(float(alone[r][k]) - float(grouped[r][k]))
                    for r in alone for k in alone[r]
                    if isinstance(alone[r][k], float) and not k.startswith("time/"))
        result[mode if mode == "sequential" else f"grouped_{mode}"] = {
            "runs": len(grouped), "cpu_s": cpu, "wall_s": wall,
            "cpu_s_per_run": cpu / len(grouped), "runs_per_cpu_s": len(grouped) / cpu,
            "speedup_runs_per_cpu_s": per_alone / (cpu / len(grouped)),
            "max_abs_summary_difference_vs_one_per_process": worst}
    result.update({"load_average_1min": load, "cpu_count": os.cpu_count()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
