"""A study's run keeps its weights (``checkpoint.pt``) only while it trains, unless the study is
asked to keep them (``--keep-weights``); a finished run without weights stays finished; the
report states what the runs cost in CPU-seconds (issue 24 items 4 and 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from crl.cli import app
from crl.experiments import get_study
from crl.experiments.executors.base import drop_weights
from crl.experiments.report import compute_text, compute_totals
from crl.experiments.results import read_results
from crl.experiments.runner import run_study
from crl.rundir import CHECKPOINT_FILE, CONFIG_FILE, METRICS_FILE, SUMMARY_FILE
from crl.train.checkpoint import load_checkpoint

runner = CliRunner()
SMALL = ["--preset", "smoke", "--data", "synthetic", "--ns", "64", "--budget", "128",
         "--model", "linear", "--refine-runs", "0", "--workers", "1", "--no-progress"]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _runs(study_dir: Path) -> list[Path]:
    return sorted(p.parent for p in study_dir.glob(f"*/{SUMMARY_FILE}"))


@pytest.mark.parametrize("group", [True, False], ids=["grouped", "alone"])
def test_a_finished_run_keeps_its_summary_metrics_and_config_but_not_its_weights(
        tmp_path: Path, group: bool) -> None:
    study = get_study("negatives", preset="smoke", data="synthetic", ns=[64], budget=128,
                      model="linear", refine_runs=0)
    outcome = run_study(study, tmp_path, workers=1, progress=False, group_runs=group)
    assert not outcome.failed and outcome.completed == outcome.total == 5
    runs = _runs(outcome.study_dir)
    assert len(runs) == 5
    for run in runs:
        assert not (run / CHECKPOINT_FILE).exists()
        assert all((run / name).exists() for name in (CONFIG_FILE, METRICS_FILE, "spec.json"))
    before = {run: (run / METRICS_FILE).read_bytes() for run in runs}
    again = run_study(study, tmp_path, workers=1, progress=False, group_runs=group)
    assert again.skipped == 5 and again.completed == 0 and not again.failed  # still finished
    assert {run: (run / METRICS_FILE).read_bytes() for run in runs} == before


def test_keep_weights_keeps_every_finished_runs_checkpoint(tmp_path: Path) -> None:
    result = runner.invoke(app, ["study", "negatives", *SMALL, "--keep-weights", "--out",
                                 str(tmp_path)])
    assert result.exit_code == 0, result.output
    runs = _runs(tmp_path / "negatives")
    assert len(runs) == 5
    for run in runs:
        summary = json.loads((run / SUMMARY_FILE).read_text())
        assert load_checkpoint(run / CHECKPOINT_FILE)["step"] == summary["step"]
    recorded = json.loads((tmp_path / "negatives" / "study.json").read_text())
    assert "keep_weights" not in recorded["options"]  # how to run it, not what it computes
    plain = runner.invoke(app, ["study", "negatives", *SMALL, "--no-group", "--out",
                                str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output
    assert not list((tmp_path / "plain").glob(f"*/*/{CHECKPOINT_FILE}"))


def test_drop_weights_needs_a_summary_and_never_follows_a_link(tmp_path: Path) -> None:
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (run / "train").mkdir(parents=True)
    elsewhere.mkdir()
    for folder in (run, run / "train", elsewhere):
        (folder / CHECKPOINT_FILE).write_bytes(b"weights")
    (run / "linked").symlink_to(elsewhere)
    with pytest.raises(RuntimeError, match=r"holds no summary\.json"):
        drop_weights(run)
    assert (run / CHECKPOINT_FILE).exists()
    (run / SUMMARY_FILE).write_text("{}")
    drop_weights(run)
    assert not (run / CHECKPOINT_FILE).exists() and not (run / "train" / CHECKPOINT_FILE).exists()
    assert (elsewhere / CHECKPOINT_FILE).read_bytes() == b"weights"


def test_the_report_gives_runs_per_cpu_second(tmp_path: Path) -> None:
    result = runner.invoke(app, ["study", "negatives", *SMALL, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    study_dir = tmp_path / "negatives"
    compute = json.loads((study_dir / "analysis.json").read_text())["compute"]
    rows = read_results(study_dir / "results.csv")
    distinct = {r["run_id"]: r for r in rows}
    assert compute["runs"] == compute["timed_runs"] == len(distinct) == 5
    cpu = sum(float(r["time/cpu_s"]) for r in distinct.values())
    assert compute["cpu_s"] == pytest.approx(cpu, rel=1e-9)
    assert compute["runs_per_cpu_s"] == pytest.approx(5 / cpu, rel=1e-9)
    group = {r["time/group_s"] for r in distinct.values()}
    assert len(group) == 1 and {r["time/group_size"] for r in distinct.values()} == {5}
    assert sum(float(r["time/train_eval_s"]) for r in distinct.values()) == \
        pytest.approx(group.pop(), rel=1e-6)
    page = (study_dir / "report.html").read_text()
    assert "runs per CPU-second" in page and f"{compute['runs_per_cpu_s']:.4g}" in page


def test_older_results_without_cpu_time_still_load(tmp_path: Path) -> None:
    # the committed results without the column, as studies wrote them before time/cpu_s
    lines = (DOCS / "negatives-full" / "results.csv").read_text().splitlines()
    column = lines[0].split(",").index("time/cpu_s")
    older = tmp_path / "results.csv"
    older.write_text("\n".join(",".join(c for i, c in enumerate(line.split(","))
                                        if i != column) for line in lines) + "\n")
    rows = read_results(older)
    totals = compute_totals(rows)
    assert totals["runs"] > 200 and totals["timed_runs"] == 0
    assert totals["runs_per_cpu_s"] is None
    assert compute_text(totals).startswith("Compute: not recorded")


@pytest.mark.parametrize("name", ["negatives-quick", "negatives-full"])
def test_the_committed_results_record_their_cpu_time(name: str) -> None:
    totals = compute_totals(read_results(DOCS / name / "results.csv"))
    assert totals["runs"] == totals["timed_runs"] > 200
    assert totals["runs_per_cpu_s"] is not None and totals["runs_per_cpu_s"] > 0
