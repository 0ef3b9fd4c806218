"""Where the time of a quick-preset study goes: one ``(n, seed)`` group of the quick negatives
study (``crl study negatives --preset quick``: pycode, GCL over an embedding-bag tower, batch
128, 12,000 samples a run), trained as a study worker trains it (``fit_group``), under
``cProfile`` with the process's CPU clock (``time.process_time``: every thread of the process,
so a shared machine's load moves it less than wall time).

The CPU time is broken into phases by the cumulative time of the functions that do them
(:data:`PHASES`; each phase is one or more functions, and no phase contains another's
functions, except the indented sub-phases, which are parts of the phase above them):

- process start: the interpreter and ``import crl.train`` (measured before the profile starts);
- build: the data (loading, tokenising), the models, objectives and optimisers (``fit_group``
  before its training loop);
- data and batching: the sampler and the DataLoader's batches;
- towers (forward), loss (of which: the negative-set masks), backward;
- optimiser: each run's gradient checks, clipping, optimiser and schedule step;
- records, checkpoints, evaluation;
- other: the rest of the training loop (Python glue).

Each tree is profiled in a fresh child process with ``PYTHONPATH=<tree>/src``, so the same
script measures the code before and after a change side by side::

    .venv/bin/python benchmarks/profile_run.py --tree /path/to/old/checkout --tree . \\
        --out benchmarks/results/profile_run.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]

#: Phase -> the functions whose cumulative CPU time it is: ``(file suffix, function name)``.
#: Names of several versions of the code are listed; a function absent from a tree adds nothing.
PHASES: dict[str, list[tuple[str, str]]] = {
    "build": [("crl/train/grouped.py", "_build"), ("crl/train/trainer.py", "start")],
    "data and batching": [("crl/train/trainer.py", "_loader"),
                          ("torch/utils/data/dataloader.py", "__next__")],
    "towers (forward)": [("crl/train/steps/towers.py", "__call__")],
    "loss": [("crl/train/step.py", "batch_loss"), ("crl/train/steps/batched.py", "_losses"),
             ("crl/losses/gcl_group.py", "__call__")],
    "  of which negative masks": [("crl/negatives/sets.py", "mask")],
    "backward": [("torch/autograd/__init__.py", "backward")],
    "optimiser": [("crl/train/trainer.py", "update")],
    "records": [("crl/train/writer.py", "record")],
    "checkpoints": [("crl/train/trainer.py", "checkpoint")],
    "evaluation": [("crl/train/trainer.py", "finish")],
}
SUBPHASE_INDENT = "  "

CHILD = r"""
import cProfile, json, pstats, resource, sys, tempfile, time
started = resource.getrusage(resource.RUSAGE_SELF)
import torch
from crl.experiments.negatives import NegativesStudy
from crl.train import fit_group, validate_config
imported = resource.getrusage(resource.RUSAGE_SELF)
torch.set_num_threads(1)
n, seed, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
specs = {s.run_id: s for s in NegativesStudy("quick").runs()
         if s.tags["n"] == n and s.tags["seed"] == seed and "stage" not in s.tags}
specs = [specs[k] for k in sorted(specs)]
configs = [validate_config(s.config) for s in specs]
profile = cProfile.Profile(time.process_time)
wall = time.perf_counter()
profile.enable()
results = fit_group(configs, [f"{out}/{s.run_id}" for s in specs])
profile.disable()
wall = time.perf_counter() - wall
cpu = lambda r: r.ru_utime + r.ru_stime
stats = pstats.Stats(profile).stats
functions = [[f, line, name, cum] for (f, line, name), (_, _, _, cum, _) in stats.items()]
print(json.dumps({"runs": len(specs), "wall_s": wall, "start_cpu_s": cpu(imported),
                  "functions": functions, "total_cpu_s": sum(v[2] for v in stats.values()),
                  "summaries": {s.run_id: r.summary for s, r in zip(specs, results)}}))
"""


def _phase_seconds(functions: list[list[Any]]) -> dict[str, float]:
    """Each phase's CPU seconds: the sum over its functions of their cumulative times (of
    methods of one name in one file, the largest: ``Trainer.finish`` calls
    ``TrainingRun.finish``)."""
    out = {}
    for phase, keys in PHASES.items():
        out[phase] = sum(max((cum for f, _, fn, cum in functions
                              if fn == name and f.replace(os.sep, "/").endswith(suffix)),
                             default=0.0) for suffix, name in keys)
    return out


def profile_tree(tree: Path, n: int, seed: int) -> dict[str, Any]:
    """Profile the ``(n, seed)`` group of the quick preset with the code of ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([sys.executable, "-c", CHILD, str(n), str(seed), out], env=env,
                              capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"profile of {tree} failed:\n{proc.stderr[-3000:]}")
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    phases = _phase_seconds(raw["functions"])
    loop = raw["total_cpu_s"]
    # fit_group's own cumulative time is the profiled total; what no phase holds is "other".
    top = sum(v for k, v in phases.items() if not k.startswith(SUBPHASE_INDENT))
    phases["other"] = max(0.0, _fit_group_seconds(raw["functions"]) - top)
    phases = {"process start (interpreter, imports)": raw["start_cpu_s"], **phases}
    total = sum(v for k, v in phases.items() if not k.startswith(SUBPHASE_INDENT))
    return {"tree": str(tree), "commit": _commit(tree), "n": n, "seed": seed,
            "runs": raw["runs"], "wall_s": raw["wall_s"], "cpu_s": total,
            "cpu_s_per_run": total / raw["runs"], "phases_cpu_s": phases,
            "profiled_cpu_s": loop, "summaries": raw["summaries"]}


def _fit_group_seconds(functions: list[list[Any]]) -> float:
    return max((cum for f, _, fn, cum in functions
                if fn == "fit_group" and f.endswith("crl/train/grouped.py")), default=0.0)


def _commit(tree: Path) -> str | None:
    proc = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() or None


def table(rows: list[dict[str, Any]]) -> str:
    """The phases of each profiled tree side by side, in CPU seconds and % of the total."""
    names = list(rows[0]["phases_cpu_s"])
    head = "| phase | " + " | ".join(f"{r['commit']} (s) | %" for r in rows) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(rows)]
    for name in names:
        cells = []
        for r in rows:
            v = r["phases_cpu_s"].get(name, 0.0)
            cells += [f"{v:.2f}", f"{100 * v / r['cpu_s']:.0f}"]
        label = "- " + name.strip() if name.startswith(SUBPHASE_INDENT) else name
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(f"**{r['cpu_s']:.2f}** | 100" for r in rows)
                 + " |")
    lines.append("| per run | " + " | ".join(f"{r['cpu_s_per_run']:.2f} | " for r in rows)
                 + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", type=Path,
                        help="a checkout to profile (repeat; default: this one)")
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "runs/bench/profile_run.json")
    args = parser.parse_args()
    load = os.getloadavg()
    rows = [profile_tree(t.resolve(), args.n, args.seed) for t in (args.tree or [ROOT])]
    result = {"load_before": load, "load_after": os.getloadavg(), "python": sys.version,
              "rows": rows, "table": table(rows)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(result["table"])
    print(f"load average {load[0]:.1f} -> {os.getloadavg()[0]:.1f}; written to {args.out}")


if __name__ == "__main__":
    main()
