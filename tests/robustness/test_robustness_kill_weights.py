"""Kill -9 of a study whose runs checkpoint by time (issue 24 item 4): a run killed between two
checkpoints resumes from its last one, the study ends with the results.csv of an uninterrupted
study, and no finished run keeps its weights (``checkpoint.pt``) unless asked.

The study's runs checkpoint every 60 s (``train.checkpoint_every_s``, no step interval); the
command runs with a clock 600 times fast (the 60 s are 0.1 s here), so that its runs checkpoint
several times before the kill.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from crl.experiments.registry import get_study
from crl.experiments.results import RESULTS_FILE, collect_rows, read_results
from crl.experiments.runner import run_study
from crl.rundir import CHECKPOINT_FILE, SUMMARY_FILE, read_json, read_jsonl
from crl.train.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow

TIMEOUT = 240.0
#: 3 distinct runs of 400 steps (n = 64 in batches of 32; m = 25% in both regimes and 100%),
#: one (n, seed): one group, trained in the command's own process (one worker).
OPTIONS = {"data": "synthetic", "ns": [64], "fractions": [0.25, 1.0], "seeds": [0],
           "budget": 12_800, "batch_size": 32, "refine_runs": 0}
ARGS = ["study", "negatives", "--preset", "smoke", "--data", "synthetic", "--ns", "64",
        "--fractions", "0.25,1", "--seeds", "0", "--budget", "12800", "--batch-size", "32",
        "--refine-runs", "0", "--workers", "1", "--no-progress"]
#: ``python -m crl`` with the checkpoint clock of crl.train.timing 600 times fast.
FAST_CLOCK = ("import sys, time, types; import crl.train.timing as timing; "
              "timing.time = types.SimpleNamespace(monotonic=lambda: 600 * time.monotonic(), "
              "perf_counter=time.perf_counter, process_time=time.process_time); "
              "from crl.cli import main; sys.argv[0] = 'crl'; main()")


def _crl(args: list[str]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("CRL_DEBUG", "PYTEST_XDIST_WORKER")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen([sys.executable, "-c", FAST_CLOCK, *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def _mid_checkpoints(study_dir: Path) -> list[Path]:
    """The run directories with a checkpoint and no summary (a run being trained)."""
    return [p.parent for p in study_dir.glob(f"*/{CHECKPOINT_FILE}")
            if not (p.parent / SUMMARY_FILE).exists()]


def _last_step(run_dir: Path) -> int:
    try:
        return max((int(r["step"]) for r in read_jsonl(run_dir / "metrics.jsonl")), default=0)
    except (OSError, ValueError):
        return 0


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-6 * max(1.0, abs(b)) or (a != a and b != b)
    return bool(a == b)


def test_a_study_killed_between_time_based_checkpoints_ends_as_an_uninterrupted_one(
        tmp_path: Path) -> None:
    study = get_study("negatives", preset="smoke", **OPTIONS)
    specs = study.runs()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        run_study(study, tmp_path / "reference", workers=1, progress=False)
    finally:
        torch.set_num_threads(threads)
    expected = {(r["run_id"], r["regime"]): r
                for r in collect_rows(specs, tmp_path / "reference" / "negatives")}
    assert len(expected) == len(specs) == 4

    out = tmp_path / "out"
    study_dir = out / "negatives"
    proc = _crl([*ARGS, "--out", str(out)])
    deadline = time.monotonic() + TIMEOUT
    # Kill once a run is past a checkpoint of its own, between two: by time, as the grid has
    # no step interval.
    while proc.poll() is None and time.monotonic() < deadline:
        busy = _mid_checkpoints(study_dir)
        if busy and _last_step(busy[0]) > load_checkpoint(busy[0] / CHECKPOINT_FILE)["step"]:
            break
        time.sleep(0.002)
    assert proc.poll() is None, "the study finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    killed = {d: int(load_checkpoint(d / CHECKPOINT_FILE)["step"]) for d in _mid_checkpoints(
        study_dir)}
    assert killed and all(0 < step < 400 for step in killed.values()), killed
    before = {d: [r for r in read_jsonl(d / "metrics.jsonl") if int(r["step"]) <= step]
              for d, step in killed.items()}

    again = _crl([*ARGS, "--out", str(out)])
    _, err = again.communicate(timeout=TIMEOUT)
    assert again.returncode == 0, err.decode(errors="replace")

    rows = read_results(study_dir / RESULTS_FILE)
    assert {(r["run_id"], r["regime"]) for r in rows} == set(expected)
    for row in rows:
        reference = expected[(row["run_id"], row["regime"])]
        bad = {k: (row.get(k), v) for k, v in reference.items()
               if not k.startswith("time/") and not _close(row.get(k), v)}
        assert not bad, (row["run_id"], bad)
    for run_dir, records in before.items():  # resumed from its checkpoint, not started over
        assert read_jsonl(run_dir / "metrics.jsonl")[:len(records)] == records
    run_dirs = {study_dir / s.run_id for s in specs}
    assert all(read_json(d / SUMMARY_FILE)["step"] == 400 for d in run_dirs)
    assert not [d for d in run_dirs if (d / CHECKPOINT_FILE).exists()], "weights were kept"
    assert all((d / name).exists() for d in run_dirs
               for name in ("config.json", "metrics.jsonl", "spec.json"))
