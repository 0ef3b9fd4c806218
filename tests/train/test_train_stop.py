"""A stop request (crl.train.stop: what a study's worker does on SIGINT/SIGTERM) ends training
right after the next checkpoint: no step past it is trained or logged, the run is not finished,
and a resumed run ends exactly as an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from crl.train import fit, load_config
from crl.train import stop as stop_module
from crl.train.steps import SingleStep
from crl.train.steps import single as single_module

_BASE = ["data.num_train=64", "data.synthetic.num_samples=120", "train.batch_size=16",
         "train.steps=9", "train.log_every=1", "train.checkpoint_every=4", "model.kind=mlp",
         "model.embed_dim=8", "model.hidden_dim=16", "eval.probe=false"]


#: Each test gets its own (unset) stop-request flag and one torch thread (tests/train/conftest.py).
pytestmark = pytest.mark.usefixtures("fresh_stop_flag")


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _request_at(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Request a stop (as the worker's signal handler does) during optimiser step ``step``."""
    calls = {"n": 0}
    original = SingleStep.__call__

    def counting(self: SingleStep, learners: Any, batch: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == step:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the flag
        return original(self, learners, batch)

    monkeypatch.setattr(single_module.SingleStep, "__call__", counting)


def test_a_stop_request_ends_the_run_at_the_next_checkpoint_and_it_resumes_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config("synthetic-gaussian", _BASE)
    reference = fit(cfg, tmp_path / "whole", progress=False)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop_module.stop_on_signals()
        _request_at(monkeypatch, 2)  # during step 2: steps 3 and 4 run, then the checkpoint
        with pytest.raises(stop_module.StopRequested, match="checkpoint of step 4"):
            fit(cfg, tmp_path / "stopped", progress=False)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    stopped = tmp_path / "stopped"
    assert [r["step"] for r in _records(stopped)] == [1, 2, 3, 4]  # nothing past the checkpoint
    assert not (stopped / "summary.json").exists()
    checkpoint = torch.load(stopped / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] == 4
    monkeypatch.undo()
    monkeypatch.setattr(stop_module, "_REQUESTED", threading.Event())  # undone above
    resumed = fit(cfg, stopped, resume=True, progress=False)
    assert resumed.finished and resumed.step == 9
    assert _records(stopped) == _records(tmp_path / "whole")
    drop = {"time/train_eval_s", "time/cpu_s"}  # the only entries that are not deterministic
    assert {k: v for k, v in resumed.summary.items() if k not in drop} == \
        {k: v for k, v in reference.summary.items() if k not in drop}


def test_a_worker_takes_no_new_task_once_a_stop_was_requested() -> None:
    from crl.experiments.executors.local import _run

    class Task:
        started = False

        def run(self) -> list[Any]:
            Task.started = True
            return []

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop_module.request_stop()
        with pytest.raises(stop_module.StopRequested):
            _run(Task())  # type: ignore[arg-type]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert not Task.started
