"""The smoothed training loss (:mod:`crl.train.smoothing`): ``train/loss_ema`` is the
bias-corrected moving average of the per-step losses, ``train/loss_mean`` the mean since the
previous record; both in ``metrics.jsonl`` through ``crl train``, in TensorBoard's scalars and
in the progress bar, beside the raw ``train/loss``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import crl.train.writer as writer_module
from crl.cli import app
from crl.train import fit, load_config
from crl.train.progress import TrainProgress
from crl.train.smoothing import EMA_DECAY, LossSmoother

runner = CliRunner()
SETTINGS = ["data.num_train=256", "data.synthetic.num_samples=400", "train.batch_size=32",
            "train.steps=9", "train.num_threads=1", "eval.probe=false"]


def _ema(losses: list[float], decay: float) -> float:
    """The weighted mean of the losses, step ``s`` weighing ``decay**(t - s)``."""
    weights = [decay ** (len(losses) - 1 - s) for s in range(len(losses))]
    return sum(w * x for w, x in zip(weights, losses, strict=True)) / sum(weights)


@pytest.mark.parametrize("decay", [EMA_DECAY, 0.5])
def test_ema_and_mean_formulas(decay: float) -> None:
    losses = [3.0, 1.5, 2.25, 0.5, 4.0, 1.0, 0.75]
    smoother = LossSmoother(decay)
    since = 0
    for t, loss in enumerate(losses, start=1):
        values = smoother.add(loss)
        assert values["train/loss_ema"] == pytest.approx(_ema(losses[:t], decay), rel=1e-12)
        window = losses[since:t]
        assert values["train/loss_mean"] == pytest.approx(sum(window) / len(window), rel=1e-12)
        if t % 3 == 0:
            smoother.recorded()
            since = t
    again = LossSmoother(decay)
    again.load_state_dict(smoother.state_dict())
    assert again == smoother
    again.load_state_dict(None)  # a checkpoint without it: afresh
    assert again == LossSmoother(decay)


def _records(run: Path) -> list[dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train/loss" in r]


def _train(tmp: Path, name: str, log_every: int) -> list[dict[str, Any]]:
    sets = [arg for s in [*SETTINGS, f"train.log_every={log_every}"] for arg in ("--set", s)]
    result = runner.invoke(app, ["train", "synthetic-gaussian", "--out", str(tmp / name),
                                 "--no-progress", *sets])
    assert result.exit_code == 0, result.output
    return _records(next((tmp / name).glob("*/metrics.jsonl")).parent)


def test_metrics_jsonl_through_the_cli(tmp_path: Path) -> None:
    """Every step logged gives the per-step losses; a run logging every 3 steps (the same
    training) records the mean of the 3 steps' losses and the moving average of all."""
    every = _train(tmp_path, "every", 1)
    losses = [r["train/loss"] for r in every]
    assert [r["step"] for r in every] == list(range(1, 10)) and len(set(losses)) == 9
    for r in every:
        assert r["train/loss_mean"] == r["train/loss"]
    third = _train(tmp_path, "third", 3)
    assert [r["step"] for r in third] == [3, 6, 9]
    for r in third:
        step = r["step"]
        assert r["train/loss"] == losses[step - 1]  # the raw value stays
        assert r["train/loss_mean"] == pytest.approx(sum(losses[step - 3:step]) / 3, rel=1e-12)
        assert r["train/loss_ema"] == pytest.approx(_ema(losses[:step], EMA_DECAY), rel=1e-12)
        assert r["train/loss_ema"] == every[step - 1]["train/loss_ema"]


def test_tensorboard_gets_the_smoothed_loss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    seen: dict[str, list[float]] = {}

    class Events:  # stands in for TensorBoard's writer (the package is optional)
        def __init__(self, run_dir: Path) -> None:
            pass

        def scalars(self, record: dict[str, Any], step: int) -> None:
            for key in ("train/loss", "train/loss_ema", "train/loss_mean"):
                if key in record:
                    seen.setdefault(key, []).append(record[key])

        def close(self) -> None:
            pass

    monkeypatch.setattr(writer_module, "TensorBoardWriter", Events)
    cfg = load_config("synthetic-gaussian", [*SETTINGS, "train.log_every=3"])
    fit(cfg, tmp_path / "run", progress=False, tensorboard=True)
    records = _records(tmp_path / "run")
    assert seen == {key: [r[key] for r in records]
                    for key in ("train/loss", "train/loss_ema", "train/loss_mean")}


def test_progress_bar_shows_the_smoothed_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with TrainProgress(total=4, start=0, batch_size=2) as bar:
        bar.update(1, loss=0.5, smoothed=0.625)
        fields = bar._progress.tasks[0].fields
    assert fields["loss"] == "0.5000" and fields["ema"] == "0.6250"
