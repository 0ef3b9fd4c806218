"""Grouped runs in a study (crl.experiments.grouping): a study trained with its runs of one
(n, seed) together writes the same run directories and results.csv as with --no-group, and a
group whose towers cannot be batched exactly falls back to one run at a time."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from typer.testing import CliRunner

from crl.cli import app
from crl.experiments import get_study
from crl.experiments.grouping import GROUP_ERROR_FILE, GroupTask, plan_tasks
from crl.rundir import METRICS_FILE, SUMMARY_FILE

runner = CliRunner()
SMALL = ["--preset", "smoke", "--data", "synthetic", "--ns", "64", "--budget", "256",
         "--workers", "1", "--no-progress"]


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return [{k: v for k, v in row.items() if not k.startswith("time/")}
                for row in csv.DictReader(handle)]


def _study(tmp_path: Path, name: str, *extra: str) -> Path:
    result = runner.invoke(app, ["study", "negatives", *SMALL, "--out", str(tmp_path / name),
                                 *extra])
    assert result.exit_code == 0, result.output
    return tmp_path / name / "negatives"


def test_grouped_study_equals_one_run_at_a_time(tmp_path: Path) -> None:
    grouped = _study(tmp_path, "grouped", "--model", "linear")
    alone = _study(tmp_path, "alone", "--model", "linear", "--no-group")
    assert _rows(grouped / "results.csv") == _rows(alone / "results.csv")
    study = get_study("negatives", preset="smoke", data="synthetic", model="linear",
                      ns=[64], budget=256)
    specs = list({s.run_id: s for s in study.runs()}.values())
    tasks = plan_tasks(study, specs, tmp_path / "fresh")
    assert sorted(len(t.specs) for t in tasks if isinstance(t, GroupTask)) == [5]
    for spec in specs:
        left, right = grouped / spec.run_id, alone / spec.run_id
        assert not (left / GROUP_ERROR_FILE).exists()
        assert (left / METRICS_FILE).read_text() == (right / METRICS_FILE).read_text()
        one, two = (json.loads((d / SUMMARY_FILE).read_text()) for d in (left, right))
        assert {k: v for k, v in one.items() if not k.startswith("time/")} == \
            {k: v for k, v in two.items() if not k.startswith("time/")}


def test_a_group_that_cannot_batch_exactly_trains_one_at_a_time(tmp_path: Path) -> None:
    study_dir = _study(tmp_path, "mlp")  # the default MLP towers hold layer norms
    errors = sorted(study_dir.glob(f"*/{GROUP_ERROR_FILE}"))
    assert errors and "LayerNorm" in errors[0].read_text()
    assert all((d / SUMMARY_FILE).exists() for d in {e.parent for e in errors})
    assert len(_rows(study_dir / "results.csv")) == len(
        get_study("negatives", preset="smoke", data="synthetic", ns=[64],
                  budget=256).runs())
