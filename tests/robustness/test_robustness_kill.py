"""Kill -9 at several moments of ``crl train`` and ``crl study``: resuming (or re-running) reaches
exactly the result of an uninterrupted run, no file is left torn, and nothing is counted twice.

Each test launches the real command line in its own process group, polls the output directory
for a moment (the first checkpoint, a step mid-way, a checkpoint temp file being written, the
first finished run of a study, the analysis stage), sends SIGKILL to the whole group, checks that
every file in the directory is readable, then continues. The final state is compared with an
uninterrupted run of the same config (summary metrics and checkpoint weights to 1e-6).
"""

from __future__ import annotations

import json
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
import torch

from crl.experiments.registry import get_study
from crl.experiments.results import RESULTS_FILE, collect_rows, read_results
from crl.experiments.runner import run_study
from crl.rundir import read_json, read_jsonl
from crl.train import config_hash, fit, load_config
from crl.train.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow

# A tiny synthetic run: 512 pairs, batches of 32 (16 steps an epoch), 240 steps, a checkpoint
# every 7 steps (so most kills fall between two checkpoints), validation every 50 steps.
TRAIN_OVERRIDES = [
    "data.synthetic.num_samples=512", "train.batch_size=32", "train.steps=240",
    "train.log_every=1", "train.eval_every=50", "train.checkpoint_every=7",
    "train.num_threads=1", "model.kind=mlp", "model.embed_dim=8", "model.hidden_dim=16",
    "eval.ks=[1, 5]",
]
PRESET = "synthetic-gaussian"
TIMEOUT = 240.0


def _crl(args: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    """``python -m crl ARGS`` in a new process group (so a kill reaches its workers too)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CRL_DEBUG", "PYTEST_XDIST_WORKER")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen([sys.executable, "-m", "crl", *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def _kill_when(proc: subprocess.Popen[bytes], condition: Callable[[], bool]) -> bool:
    """SIGKILL the process group of ``proc`` as soon as ``condition()`` holds (polled every
    few ms). Returns True if the process was still running when killed."""
    deadline = time.monotonic() + TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        if condition():
            break
        time.sleep(0.002)
    alive = proc.poll() is None
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _, err = proc.communicate()
    # A process that ended on its own before the kill must have succeeded.
    assert alive or proc.returncode == 0, err.decode(errors="replace")
    return alive


def _finish(proc: subprocess.Popen[bytes]) -> None:
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err.decode(errors="replace")


def _last_step(run_dir: Path) -> int:
    try:
        records = read_jsonl(run_dir / "metrics.jsonl")
    except (OSError, ValueError):
        return 0
    return max((int(r["step"]) for r in records), default=0)


def _checkpoint_temp(run_dir: Path) -> bool:
    return any(run_dir.glob(".checkpoint.pt.*.tmp"))


def _assert_readable(folder: Path) -> None:
    """Every JSON parses, every JSON-lines file reads (a torn last line is dropped), every
    checkpoint loads, and a checkpoint's step is never past the last metrics record."""
    for path in folder.rglob("*"):
        if path.name.endswith(".tmp") or not path.is_file():
            continue
        if path.suffix == ".json":
            read_json(path)
        elif path.suffix == ".jsonl":
            read_jsonl(path)
        elif path.suffix == ".pt":
            state = load_checkpoint(path)
            assert int(state["step"]) <= max(
                (int(r["step"]) for r in read_jsonl(path.parent / "metrics.jsonl")), default=0)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=False)
    return {f"{part}.{k}": v for part in ("model", "objective") for k, v in state[part].items()}


def _assert_close_values(x: Any, y: Any, where: str) -> None:
    if isinstance(x, float) or isinstance(y, float):
        assert isinstance(x, (int, float)) and isinstance(y, (int, float)), where
        assert (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 1e-6 * max(1.0, abs(y)), where
    else:
        assert x == y, where


def _without_time(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if not k.startswith("time/")}


def test_kill_train_at_several_moments_then_resume(tmp_path: Path) -> None:
    cfg = load_config(PRESET, TRAIN_OVERRIDES)
    reference = tmp_path / "reference"
    threads = torch.get_num_threads()
    try:
        fit(cfg, reference, progress=False)
    finally:
        torch.set_num_threads(threads)

    out = tmp_path / "out"
    run_dir = out / f"{PRESET}-{config_hash(cfg)}"
    args = ["train", PRESET, "--out", str(out), "--no-progress"]
    for item in TRAIN_OVERRIDES:
        args += ["--set", item]
    kills: list[tuple[str, Callable[[], bool]]] = [
        ("first checkpoint", lambda: (run_dir / "checkpoint.pt").exists()),
        ("mid-way, between checkpoints", lambda: _last_step(run_dir) >= 110),
        ("while a checkpoint is written",
         lambda: _checkpoint_temp(run_dir) or _last_step(run_dir) >= 200),
    ]
    interrupted = 0
    for number, (moment, condition) in enumerate(kills):
        resume = ["--resume"] if number > 0 else []
        interrupted += _kill_when(_crl(args + resume, tmp_path), condition)
        assert not (run_dir / "summary.json").exists() or number == len(kills) - 1, moment
        _assert_readable(run_dir)
        if number == 0:  # without --resume an interrupted run is refused, in one line
            again = _crl(args, tmp_path)
            _, err = again.communicate(timeout=TIMEOUT)
            assert again.returncode == 2 and err.decode().startswith("error:"), err
            assert "--resume" in err.decode() and len(err.decode().splitlines()) == 1
    assert interrupted >= 2, "the run finished before it could be killed"
    if not any(run_dir.glob(".checkpoint.pt.*.tmp")):  # the poll missed the write: as if hit
        (run_dir / ".checkpoint.pt.k9x2.tmp").write_bytes(
            (run_dir / "checkpoint.pt").read_bytes()[:1000])
    _finish(_crl([*args, "--resume"], tmp_path))

    _assert_readable(run_dir)
    expected = _without_time(read_json(reference / "summary.json"))
    got = _without_time(read_json(run_dir / "summary.json"))
    assert got.keys() == expected.keys()
    for key in expected:
        _assert_close_values(got[key], expected[key], key)
    ours, theirs = _weights(run_dir / "checkpoint.pt"), _weights(reference / "checkpoint.pt")
    assert ours.keys() == theirs.keys()
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=1e-6, equal_nan=True)
    # metrics.jsonl: each (step, split) once, and the same records as the uninterrupted run.
    records = read_jsonl(run_dir / "metrics.jsonl")
    keys = [(int(r["step"]), r.get("split"), bool(r.get("final"))) for r in records]
    assert len(keys) == len(set(keys))
    reference_records = read_jsonl(reference / "metrics.jsonl")
    assert len(records) == len(reference_records)
    for mine, other in zip(records, reference_records, strict=True):
        assert mine.keys() == other.keys()
        for key in other:
            _assert_close_values(mine[key], other[key], f"step {other['step']} {key}")
    # A temp file left by the kill during a checkpoint write is deleted by the resume.
    assert {p.name for p in run_dir.iterdir()} == {p.name for p in reference.iterdir()}


STUDY_ARGS = ["study", "negatives", "--preset", "smoke", "--data", "synthetic", "--workers", "2",
              "--no-progress"]


def _finished_runs(study_dir: Path) -> int:
    return sum(1 for _ in study_dir.glob("*/summary.json"))


def _row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["run_id"], row["regime"], row["n"], row["m"], row["seed"])


def test_kill_study_at_several_moments_then_rerun(tmp_path: Path) -> None:
    study = get_study("negatives", preset="smoke", data="synthetic")
    specs = study.runs()
    # The reference: the same grid run in this process without interruption.
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # as each of the two workers of the CLI run
        run_study(study, tmp_path / "reference", workers=1, progress=False)
    finally:
        torch.set_num_threads(threads)
    expected = {_row_key(r): r for r in collect_rows(specs, tmp_path / "reference" / "negatives")}
    assert len(expected) == len(specs)

    out = tmp_path / "out"
    study_dir = out / "negatives"
    args = [*STUDY_ARGS, "--out", str(out)]
    kills: list[tuple[str, Callable[[], bool]]] = [
        ("first finished run", lambda: _finished_runs(study_dir) >= 1),
        ("analysis stage", lambda: (study_dir / RESULTS_FILE).exists()),
    ]
    interrupted = 0
    for moment, condition in kills:
        interrupted += _kill_when(_crl(args, tmp_path), condition)
        assert _finished_runs(study_dir) <= len({s.run_id for s in specs}), moment
        _assert_readable(study_dir)
    assert interrupted >= 1, "the study finished before it could be killed"
    _finish(_crl(args, tmp_path))

    _assert_readable(study_dir)
    rows = read_results(study_dir / RESULTS_FILE)
    keys = [_row_key(r) for r in rows]
    assert len(keys) == len(set(keys)) == len(specs)  # one row per grid point, none twice
    assert set(keys) == set(expected)
    for row in rows:
        reference = expected[_row_key(row)]
        for key, value in reference.items():
            if key.startswith("time/") or key == "run_id":
                continue
            got = row.get(key)
            if isinstance(value, float) and math.isnan(value):
                assert got is None or (isinstance(got, float) and math.isnan(got)), key
            else:
                _assert_close_values(got, value, f"{row['run_id']} {key}")
    # Every run ran to completion exactly once: one summary per unique run id, and each run's
    # metrics.jsonl has each (step, split) once.
    assert _finished_runs(study_dir) == len({s.run_id for s in specs})
    for spec in {s.run_id: s for s in specs}.values():
        records = read_jsonl(study_dir / spec.run_id / "metrics.jsonl")
        keys_run = [(int(r["step"]), r.get("split"), bool(r.get("final"))) for r in records]
        assert len(keys_run) == len(set(keys_run)), spec.run_id
        assert json.loads((study_dir / spec.run_id / "summary.json").read_text())["step"] > 0


def test_study_run_killed_before_its_first_checkpoint_is_redone(tmp_path: Path) -> None:
    """The window the kills above may miss: metrics.jsonl written, no checkpoint yet."""
    from crl.experiments.runner import execute_run

    study = get_study("negatives", preset="smoke", data="synthetic")
    spec = study.runs()[0]
    run_dir = tmp_path / spec.run_id
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\n{"step": 2, "tr')
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert execute_run(study, spec, run_dir)
    finally:
        torch.set_num_threads(threads)
    summary = read_json(run_dir / "summary.json")
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert summary["step"] == max(int(r["step"]) for r in records) > 2
    assert {"step": 1, "train/loss": 1.0} not in records  # the stale attempt was started over
    keys = [(int(r["step"]), r.get("split"), bool(r.get("final"))) for r in records]
    assert len(keys) == len(set(keys))
