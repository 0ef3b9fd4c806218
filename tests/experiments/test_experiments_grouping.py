"""Grouped runs in a study (crl.experiments.executors.grouping): a study trained with its runs
of one (n, seed) together writes the same metrics and summaries (what results.csv is made of) as
with --no-group, towers with layer norms group without batching, and a
group that fails falls back to one run at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from crl.cli import app
from crl.experiments import get_study
from crl.experiments.executors.grouping import GROUP_ERROR_FILE, GroupTask, plan_tasks
from crl.experiments.runner import run_study
from crl.rundir import METRICS_FILE, SUMMARY_FILE
from crl.train.steps import GroupStep

runner = CliRunner()
SMALL = ["--preset", "smoke", "--data", "synthetic", "--ns", "64", "--budget", "128",
         "--workers", "1", "--no-progress"]


def _study(tmp_path: Path, name: str, model: str | None = None) -> Path:
    """The small study run by the library (no report), runs of one n and seed grouped."""
    study = get_study("negatives", preset="smoke", data="synthetic", ns=[64], budget=128,
                      model=model)
    outcome = run_study(study, tmp_path / name, workers=1, progress=False)
    assert not outcome.failed and outcome.completed == outcome.total
    return outcome.study_dir


def test_grouped_study_equals_one_run_at_a_time(tmp_path: Path) -> None:
    grouped = _study(tmp_path, "grouped", "linear")
    result = runner.invoke(app, ["study", "negatives", *SMALL, "--model", "linear", "--out",
                                 str(tmp_path / "alone"), "--no-group"])
    assert result.exit_code == 0, result.output
    alone = tmp_path / "alone" / "negatives"
    study = get_study("negatives", preset="smoke", data="synthetic", model="linear",
                      ns=[64], budget=128)
    specs = list({s.run_id: s for s in study.runs()}.values())
    tasks = plan_tasks(study, specs, tmp_path / "fresh")
    assert sorted(len(t.specs) for t in tasks if isinstance(t, GroupTask)) == [5]
    split = plan_tasks(study, specs, tmp_path / "fresh", workers=3)  # no worker left idle
    assert sorted(len(t.specs) if isinstance(t, GroupTask) else 1 for t in split) == [1, 2, 2]
    for spec in specs:
        left, right = grouped / spec.run_id, alone / spec.run_id
        assert not (left / GROUP_ERROR_FILE).exists()
        assert (left / METRICS_FILE).read_text() == (right / METRICS_FILE).read_text()
        one, two = (json.loads((d / SUMMARY_FILE).read_text()) for d in (left, right))
        assert {k: v for k, v in one.items() if not k.startswith("time/")} == \
            {k: v for k, v in two.items() if not k.startswith("time/")}


def test_a_group_that_fails_trains_one_run_at_a_time(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the group broke")

    monkeypatch.setattr(GroupStep, "__call__", broken)  # after the run directories were opened
    study_dir = _study(tmp_path, "broken", "linear")
    errors = sorted(study_dir.glob(f"*/{GROUP_ERROR_FILE}"))
    assert len(errors) == 5 and "the group broke" in errors[0].read_text()
    assert all((e.parent / SUMMARY_FILE).exists() for e in errors)
    assert len(list(study_dir.glob(f"*/{SUMMARY_FILE}"))) == 5


def test_towers_with_layer_norm_train_grouped_but_separately(tmp_path: Path) -> None:
    study_dir = _study(tmp_path, "mlp")  # the default MLP towers hold layer norms
    assert not list(study_dir.glob(f"*/{GROUP_ERROR_FILE}"))
    assert len(list(study_dir.glob(f"*/{SUMMARY_FILE}"))) == 5
