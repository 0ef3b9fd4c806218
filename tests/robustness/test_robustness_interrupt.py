"""An interrupt stops a study (issue 27, row 13): SIGINT or SIGTERM to the study's main process
alone (not its process group, so the workers get no signal of their own) cancels the queued
tasks and stops the running workers (at their runs' next checkpoint, or after a grace period);
the command exits with code 130, and a re-run resumes and ends with the results of an
uninterrupted study.

The executor test runs tasks that sleep a minute on two local workers: before the fix the main
process waited for them (and started the queued ones) after printing "interrupted".
"""

from __future__ import annotations

import fcntl
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from crl.cli import app
from crl.experiments.results import read_results

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
TIMEOUT = 300.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CRL_DEBUG", "PYTEST_XDIST_WORKER")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


def _default_sigint() -> None:
    """In the child before it runs Python: SIGINT back to its default disposition, which a
    shell's background job (``pytest ... &``, nohup) inherits as ignored; Python then installs
    its own handler, as in a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` has ended (or ends within ``within`` seconds)."""
    deadline = time.monotonic() + within
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_main_process_cancels_queued_tasks_and_ends_the_workers(
        sig: signal.Signals, tmp_path: Path) -> None:
    code = ("import sys; from pathlib import Path; import interrupt_tasks; "
            "sys.exit(interrupt_tasks.main(Path(sys.argv[1]), 6, 60.0))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=_env(),
                            preexec_fn=_default_sigint,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: len(list(tmp_path.glob("started-*"))) == 2, proc)
    workers = [int(p.read_text()) for p in tmp_path.glob("started-*")]
    sent = time.monotonic()
    os.kill(proc.pid, sig)  # the main process only
    try:
        _, err = proc.communicate(timeout=45)  # before the fix: 60 s for the running tasks
    finally:
        for pid in [proc.pid, *workers]:
            if not _gone(pid, within=0):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert time.monotonic() - sent < 30
    assert all(_gone(pid) for pid in workers), "a worker outlived the interrupt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["started-0", "started-1"]


# ----------------------------------------------------------------------------- a real study

#: 6 distinct runs of 64 steps (n = 64; m = 25% in both regimes and 100%; seeds 0 and 1), one
#: task each, so that runs are queued behind the two workers.
STUDY = ["study", "negatives", "--preset", "smoke", "--data", "synthetic", "--ns", "64",
         "--fractions", "0.25,1", "--seeds", "0,1", "--budget", "2048", "--batch-size", "32",
         "--refine-runs", "0", "--no-progress", "--no-group"]


def _count(study_dir: Path, name: str) -> int:
    return sum(1 for _ in study_dir.glob(f"*/{name}"))


def _rows(path: Path) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: {k: v for k, v in r.items() if not k.startswith("time/")}
            for r in read_results(path)}


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6,
                                                                  abs_tol=1e-7)
    return bool(a == b)


def _unlocked(lock: Path) -> bool:
    with open(lock, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
    return True


def test_sigint_to_a_study_stops_it_and_a_rerun_ends_as_an_uninterrupted_study(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv("CRL_DEBUG", "0")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # as each of the two workers below
        reference = CliRunner().invoke(app, [*STUDY, "--workers", "1", "--out",
                                             str(tmp_path / "reference")])
    finally:
        torch.set_num_threads(threads)
    assert reference.exit_code == 0, reference.output
    expected = _rows(tmp_path / "reference" / "negatives" / "results.csv")
    assert len(expected) == 6

    out = tmp_path / "out"
    study_dir = out / "negatives"
    command = [sys.executable, "-m", "crl", *STUDY, "--workers", "2", "--out", str(out)]
    proc = subprocess.Popen(command, env=_env(), preexec_fn=_default_sigint,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    _wait_for(lambda: _count(study_dir, "summary.json") >= 1, proc)
    started, finished = _count(study_dir, "spec.json"), _count(study_dir, "summary.json")
    os.kill(proc.pid, signal.SIGINT)  # the main process only, not its workers
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "interrupted"
    # The running runs were stopped and nothing started after the interrupt (a run that ended,
    # or was handed to a worker, that very moment aside; before the fix the workers went on
    # with the running and queued runs), and nothing goes on after the exit: no worker holds a
    # run's lock or finishes a run.
    assert _count(study_dir, "spec.json") <= started + 1, (started, finished)
    assert _count(study_dir, "summary.json") <= finished + 1, (started, finished)
    finished = _count(study_dir, "summary.json")
    assert all(_unlocked(lock) for lock in study_dir.glob("*/.lock"))
    time.sleep(2.0)
    assert _count(study_dir, "summary.json") == finished
    assert not (study_dir / "results.csv").exists()

    again = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=TIMEOUT,
                           check=False)
    assert again.returncode == 0, again.stderr
    rows = _rows(study_dir / "results.csv")
    assert rows.keys() == expected.keys()
    for run_id, row in rows.items():
        assert row.keys() == expected[run_id].keys(), run_id
        bad = {k: (v, expected[run_id][k]) for k, v in row.items()
               if not _close(v, expected[run_id][k])}
        assert not bad, (run_id, bad)
