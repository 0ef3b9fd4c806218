"""A study's cost and answer, old code against new, in one run: runs per CPU-second, wall time,
disk, and whether the two answers agree.

Each tree runs the same study (``crl study negatives``; by default the quick preset with its
refinement; ``--refine-runs 0``: the grid alone) as a fresh child process with
``PYTHONPATH=<tree>/src`` into its own empty directory, one tree after the other. A tree's CPU
time is that of the study process and every worker it started (``RUSAGE_CHILDREN``, user +
system, all threads), so what a shared machine's other jobs take is not counted; the 1-minute
load average before and after each study is recorded beside its wall time. Disk is the size of
the study directory once it finishes (``du``-style, every file).

The answers agree when every cell's m* (each ``(n, regime)`` located in both) lies within the
other tree's interval for that cell, and each regime's exponent alpha within the other's
confidence interval. Every cell's m*, interval and status is listed side by side, so a number
the new code changed (sparse optimisation is not the same arithmetic as dense AdamW) is shown
beside the old.

Two comparisons are made, because the two trees may differ in how they read m* as well as in
how they train: ``agreement`` sets the old tree's answer (its own analysis) against the new
tree's; ``agreement_same_analysis`` sets the old tree's *runs*, read by the new tree's analysis
(its ``crl report --from-results`` over the old ``results.csv``, in a copy of the new study's
directory), against the new tree's answer, so only the training path differs.

    .venv/bin/python benchmarks/studies.py --old /path/to/old/checkout --new . \\
        --refine-runs 0 --out benchmarks/results/studies.json         # the quick grid, both
    .venv/bin/python benchmarks/studies.py --only-new --out ...       # make run's study
    .venv/bin/python benchmarks/studies.py --only-new --preset full --out ...   # 30 min goal
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _disk_bytes(path: Path) -> int:
    """Bytes of every regular file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _commit(tree: Path) -> str | None:
    proc = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() or None


def _tree_env(tree: Path) -> dict[str, str]:
    """The environment of a child process that runs ``tree``'s crl, offline."""
    return {**os.environ, "PYTHONPATH": str(tree / "src"), "HF_HUB_OFFLINE": "1"}


def run_study(tree: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run the study with the code of ``tree`` into ``out``; its cost and its answer."""
    command = [sys.executable, "-m", "crl", "study", "negatives", "--preset", args.preset,
               "--data", args.data, "--out", str(out), "--workers", str(args.workers),
               "--no-progress"]
    if args.refine_runs is not None:
        command += ["--refine-runs", str(args.refine_runs)]
    env = _tree_env(tree)
    load_before = os.getloadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"the study of {tree} failed ({proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    [study_dir] = [p for p in out.iterdir() if p.is_dir()]
    runs = sum(1 for _ in study_dir.rglob("summary.json"))
    analysis = json.loads((study_dir / "analysis.json").read_text())
    return {"tree": str(tree), "commit": _commit(tree), "study_dir": str(study_dir),
            "command": command[1:],
            "runs": runs, "wall_s": wall, "cpu_s": cpu, "runs_per_cpu_s": runs / cpu,
            "cpu_s_per_run": cpu / runs, "disk_mb": _disk_bytes(study_dir) / 1e6,
            "load_before": load_before, "load_after": os.getloadavg(),
            "answer": answer(analysis)}


def reanalyse(old_study: Path, new_study: Path, new_tree: Path, scratch: Path
              ) -> dict[str, Any]:
    """The answer of the old study's runs read by the new tree's analysis: the new study's
    directory (its study.json and data files, not its runs) with the old ``results.csv``."""
    target = scratch / "old-runs-new-analysis" / new_study.name
    target.mkdir(parents=True)
    for path in new_study.iterdir():
        if path.is_file() and path.name != "results.csv":
            shutil.copy2(path, target / path.name)
    shutil.copy2(old_study / "results.csv", target / "results.csv")
    env = _tree_env(new_tree)
    proc = subprocess.run([sys.executable, "-m", "crl", "report", str(target), "--from-results"],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the new analysis of the old runs failed ({proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return answer(json.loads((target / "analysis.json").read_text()))


def answer(analysis: dict[str, Any]) -> dict[str, Any]:
    """The parts of ``analysis.json`` the comparison reads: each cell's m*, interval and
    status, each regime's alpha and its interval, and the recommendations."""
    numbers = analysis["numbers"]
    cells = {f"{c['regime']} n={c['n']}": {"m_star": c["m_star"], "interval": c["interval"],
                                           "status": c["status"]}
             for c in numbers["cells"]}
    laws = {regime: {"alpha": law.get("alpha"), "alpha_ci": law.get("alpha_ci")}
            for regime, law in numbers["laws"].items()}
    recs = numbers["recommendations"]  # a list before issue 25, one entry per regime since
    recommendations = {r["regime"]: {"m": r.get("m"), "low": r.get("low"),
                                     "high": r.get("high")}
                       for r in (recs.values() if isinstance(recs, dict) else recs)}
    return {"cells": cells, "laws": laws, "recommendations": recommendations}


def _within(value: float | None, interval: list[float] | None) -> bool | None:
    if value is None or interval is None or None in interval:
        return None
    return bool(interval[0] <= value <= interval[1])


def _both_ways(old: dict[str, Any], new: dict[str, Any], value: str, interval: str
               ) -> dict[str, Any]:
    """Each key both answers hold: its two entries and whether each one's ``value`` lies in the
    other's ``interval``."""
    return {key: {"old": old[key], "new": new[key],
                  "new_in_old_interval": _within(new[key][value], old[key][interval]),
                  "old_in_new_interval": _within(old[key][value], new[key][interval])}
            for key in sorted(set(old) & set(new))}


def agreement(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Whether each cell's m* and each regime's alpha lie in the other's interval (both ways);
    ``agree`` is True when every comparison that both answers allow holds."""
    cells = _both_ways(old["cells"], new["cells"], "m_star", "interval")
    laws = _both_ways(old["laws"], new["laws"], "alpha", "alpha_ci")
    checks = [v for row in [*cells.values(), *laws.values()]
              for k, v in row.items() if k.endswith("_interval") and v is not None]
    return {"agree": all(checks), "checks": len(checks), "failed": checks.count(False),
            "cells": cells, "laws": laws}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, help="the checkout of the old code")
    parser.add_argument("--new", type=Path, default=ROOT, help="the checkout of the new code")
    parser.add_argument("--old-commit", help="the old tree's commit, when it is not a git "
                        "checkout (e.g. a `git archive` of it)")
    parser.add_argument("--only-new", action="store_true", help="time the new code alone")
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--data", default="pycode")
    parser.add_argument("--refine-runs", type=int, default=None,
                        help="the refinement's run budget (default: the preset's)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="keep the study directories under this one")
    parser.add_argument("--out", type=Path, default=ROOT / "runs/bench/studies.json")
    args = parser.parse_args()
    if not args.only_new and args.old is None:
        parser.error("--old is required unless --only-new")
    trees = {"new": args.new.resolve()} if args.only_new else \
        {"old": args.old.resolve(), "new": args.new.resolve()}
    result: dict[str, Any] = {"preset": args.preset, "data": args.data,
                              "refine_runs": args.refine_runs, "workers": args.workers,
                              "cpu_count": os.cpu_count(), "python": sys.version}
    with tempfile.TemporaryDirectory() as scratch:
        for name, tree in trees.items():
            out = (args.keep or Path(scratch)) / name
            out.mkdir(parents=True, exist_ok=False)
            result[name] = run_study(tree, out, args)
            if name == "old" and args.old_commit:
                result[name]["commit"] = args.old_commit
            print(f"{name}: {result[name]['runs']} runs in {result[name]['wall_s']:.0f} s, "
                  f"{result[name]['cpu_s']:.0f} CPU s, {result[name]['disk_mb']:.0f} MB",
                  flush=True)
        if not args.only_new:
            old, new = result["old"], result["new"]
            result["speedup_runs_per_cpu_s"] = new["runs_per_cpu_s"] / old["runs_per_cpu_s"]
            result["wall_ratio_new_vs_old"] = new["wall_s"] / old["wall_s"]
            result["disk_ratio_new_vs_old"] = new["disk_mb"] / old["disk_mb"]
            result["agreement"] = agreement(old["answer"], new["answer"])
            old["answer_new_analysis"] = reanalyse(Path(old["study_dir"]),
                                                   Path(new["study_dir"]), trees["new"],
                                                   Path(args.keep or scratch))
            result["agreement_same_analysis"] = agreement(old["answer_new_analysis"],
                                                          new["answer"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: v for k, v in result.items() if not isinstance(v, dict)}
    if "agreement" in result:
        summary["agree"] = result["agreement"]["agree"]
        summary["failed_checks"] = result["agreement"]["failed"]
        summary["agree_same_analysis"] = result["agreement_same_analysis"]["agree"]
        summary["failed_checks_same_analysis"] = result["agreement_same_analysis"]["failed"]
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
