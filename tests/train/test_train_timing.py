"""Checkpoints by time (``train.checkpoint_every_s``) and each run's own time in its summary
(``time/train_eval_s``, ``time/cpu_s``; a grouped run's share and its group's)."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from crl.errors import CrlValueError
from crl.train import TrainConfig, fit, fit_group, load_config, validate_config
from crl.train import stop as stop_module
from crl.train import timing as timing_module
from crl.train.steps import SingleStep
from crl.train.steps import single as single_module
from crl.train.writer import RunWriter

_BASE = ["data.num_train=64", "data.synthetic.num_samples=120", "train.batch_size=16",
         "train.steps=9", "train.log_every=1", "model.kind=mlp", "model.embed_dim=8",
         "model.hidden_dim=16", "eval.probe=false"]


#: Each test gets its own (unset) stop-request flag and one torch thread (tests/train/conftest.py).
pytestmark = pytest.mark.usefixtures("fresh_stop_flag")


def _checkpoints(monkeypatch: pytest.MonkeyPatch, *, seconds_per_step: float) -> list[int]:
    """Make every optimiser step take ``seconds_per_step`` on the checkpoint clock (nothing
    else reads it); return the list the steps of the written checkpoints are appended to."""
    now = {"t": 0.0}
    monkeypatch.setattr(timing_module.time, "monotonic", lambda: now["t"])
    original = SingleStep.__call__

    def step(self: SingleStep, learners: Any, batch: Any) -> Any:
        now["t"] += seconds_per_step
        return original(self, learners, batch)

    monkeypatch.setattr(single_module.SingleStep, "__call__", step)
    written: list[int] = []
    write = RunWriter.checkpoint

    def checkpoint(self: RunWriter, state: Any) -> None:
        written.append(int(state()["step"]))
        write(self, state)

    monkeypatch.setattr(RunWriter, "checkpoint", checkpoint)
    return written


@pytest.mark.parametrize(("extra", "expected"), [
    (["train.checkpoint_every_s=2.5"], [3, 6, 9]),
    (["train.checkpoint_every_s=2.5", "train.checkpoint_every=4"], [3, 4, 7, 8, 9]),
    (["train.checkpoint_every=4"], [4, 8, 9]),
    ([], [9]),
])
def test_a_checkpoint_is_written_when_its_time_or_its_step_is_due(
        extra: list[str], expected: list[int], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    written = _checkpoints(monkeypatch, seconds_per_step=1.0)
    fit(load_config("synthetic-gaussian", [*_BASE, *extra]), tmp_path / "run", progress=False)
    assert written == expected


def test_the_runs_of_a_group_checkpoint_together_by_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = {"t": 0.0}
    monkeypatch.setattr(timing_module.time, "monotonic", lambda: now["t"])
    record, write = RunWriter.record, RunWriter.checkpoint
    written: list[tuple[str, int]] = []

    def recorded(self: RunWriter, entry: dict[str, Any]) -> None:
        now["t"] += 0.5  # each run's record of a step: a step takes a second
        record(self, entry)

    def checkpoint(self: RunWriter, state: Any) -> None:
        written.append((self.run_dir.name, int(state()["step"])))
        write(self, state)

    monkeypatch.setattr(RunWriter, "record", recorded)
    monkeypatch.setattr(RunWriter, "checkpoint", checkpoint)
    fit_group(_group_configs(["train.checkpoint_every_s=2.5"]),
              [tmp_path / "a", tmp_path / "b"], batched=False)
    assert written == [(name, step) for step in (3, 6, 9) for name in ("a", "b")]


def test_a_stop_request_makes_a_time_based_checkpoint_due_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With checkpoints by time, a stopped worker need not wait for the end of the interval
    (the study's main process ends it 15 s after asking): the run stops after the step under
    way, and resumes to the uninterrupted run's result."""
    cfg = load_config("synthetic-gaussian", [*_BASE, "train.checkpoint_every_s=3600"])
    reference = fit(cfg, tmp_path / "whole", progress=False)
    calls = {"n": 0}
    original = SingleStep.__call__

    def step(self: SingleStep, learners: Any, batch: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the flag
        return original(self, learners, batch)

    monkeypatch.setattr(single_module.SingleStep, "__call__", step)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop_module.stop_on_signals()
        with pytest.raises(stop_module.StopRequested, match="checkpoint of step 2"):
            fit(cfg, tmp_path / "stopped", progress=False)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    monkeypatch.undo()
    monkeypatch.setattr(stop_module, "_REQUESTED", threading.Event())
    resumed = fit(cfg, tmp_path / "stopped", resume=True, progress=False)
    assert _results(resumed.summary) == _results(reference.summary)


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "'soon'"])
def test_checkpoint_every_s_must_be_a_positive_finite_number(bad: str) -> None:
    with pytest.raises(CrlValueError, match="checkpoint_every_s"):
        load_config("synthetic-gaussian", [f"train.checkpoint_every_s={bad}"])


def _results(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if not k.startswith("time/")}


def _group_configs(extra: list[str]) -> list[TrainConfig]:
    base = load_config("synthetic-gaussian", [*_BASE, "loss.name=gcl",
                                              "negatives.regime=shared", "negatives.m=4",
                                              *extra])
    data = base.model_dump(mode="json")
    out = []
    for m in (4, 16):
        data["negatives"]["m"] = m
        out.append(validate_config(json.loads(json.dumps(data))))
    return out


def test_a_lone_run_reports_its_wall_and_cpu_time(tmp_path: Path) -> None:
    summary = fit(load_config("synthetic-gaussian", _BASE), tmp_path / "run",
                  progress=False).summary
    timing = {k: v for k, v in summary.items() if k.startswith("time/")}
    assert set(timing) == {"time/train_eval_s", "time/cpu_s"}
    assert all(math.isfinite(v) and v > 0 for v in timing.values())
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["time/cpu_s"] == \
        summary["time/cpu_s"]


def test_a_grouped_run_reports_its_share_and_its_groups_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run's evaluation is its own: a run whose evaluation takes 0.3 s longer reports
    0.3 s more, and the runs' times add up to the group's."""
    import crl.train.trainer as trainer_module

    final = trainer_module.TrainingRun.final_summary

    def slow_for_b(self: Any) -> dict[str, Any]:
        if self.writer.run_dir.name == "b":
            time.sleep(0.3)
        return final(self)

    monkeypatch.setattr(trainer_module.TrainingRun, "final_summary", slow_for_b)
    results = fit_group(_group_configs([]), [tmp_path / "a", tmp_path / "b"], batched=False)
    a, b = (r.summary for r in results)
    for summary in (a, b):
        assert {k for k in summary if k.startswith("time/")} == {
            "time/train_eval_s", "time/cpu_s", "time/group_s", "time/group_size"}
        assert summary["time/group_size"] == 2 and summary["time/group_s"] == a["time/group_s"]
        assert 0 < summary["time/cpu_s"] and 0 < summary["time/train_eval_s"]
    assert math.isclose(a["time/train_eval_s"] + b["time/train_eval_s"], a["time/group_s"],
                        rel_tol=1e-9)
    assert b["time/train_eval_s"] - a["time/train_eval_s"] >= 0.25
    # time/cpu_s is the process's CPU clock (every thread): under pytest-xdist its other threads
    # can add tenths of a second to either run, so the sleep's absence from it is not asserted
    # here (a wall-clock-like bound in a shared process is flaky: it failed once at 0.42 s).
    on_disk = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert on_disk["time/group_s"] == b["time/group_s"]
