"""Smoke runs of the calibration, imbalance and gcl studies through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from crl.cli import app
from crl.experiments.studies.calibration import (
    HINGE_COUNTEREXAMPLE,
    build_model,
    model_spec,
    pairwise_minimiser,
)

runner = CliRunner()


def _run(name: str, out: Path) -> dict[str, object]:
    result = runner.invoke(app, ["study", name, "--preset", "smoke", "--out", str(out),
                                 "--workers", "1", "--no-progress"])
    assert result.exit_code == 0, result.output
    study_dir = out / name
    assert (study_dir / "report.html").stat().st_size > 1000
    assert (study_dir / "results.csv").exists()
    data: dict[str, object] = json.loads((study_dir / "analysis.json").read_text())
    return data


def test_calibration_smoke(tmp_path: Path) -> None:
    analysis = _run("calibration", tmp_path)
    numbers = analysis["numbers"]
    assert isinstance(numbers, dict)
    assert numbers["bound_violations"] == 0
    hinge = [m for m in numbers["exact_minimisers"]
             if m["loss"] == "hinge" and m["model"] == "hinge_counterexample"]
    assert hinge[0]["excess_auc"] > 0.01


@pytest.mark.parametrize("loss", ["logistic", "exponential", "squared_hinge"])
def test_consistent_pairwise_minimisers_reach_the_best_auc(loss: str) -> None:
    for name in ("random", "hinge_counterexample"):
        model = build_model(model_spec(name))
        table = pairwise_minimiser(model, loss)
        assert model.optimal_auc() - model.auc(table) == pytest.approx(0.0, abs=1e-9)


def test_hinge_minimiser_is_not_auc_optimal() -> None:
    model = build_model(HINGE_COUNTEREXAMPLE)
    table = pairwise_minimiser(model, "hinge")
    assert model.optimal_auc() - model.auc(table) > 0.02
    # and it really is the minimiser: s* (scaled) has a larger hinge risk
    best = model.pairwise_risk(table, "hinge")
    for scale in (0.5, 1.0, 2.0, 5.0, 20.0):
        assert model.pairwise_risk(scale * model.log_ratio, "hinge") > best + 1e-9


def test_imbalance_smoke(tmp_path: Path) -> None:
    analysis = _run("imbalance", tmp_path)
    numbers = analysis["numbers"]
    assert isinstance(numbers, dict)
    accuracies = numbers["balanced_accuracy"]
    assert set(accuracies) == {f"{r}/{m}" for r in (1, 100)
                               for m in ("supervised", "contrastive", "contrastive_kmeans")}
    assert all(0.0 <= v <= 1.0 for v in accuracies.values())


def test_gcl_smoke(tmp_path: Path) -> None:
    analysis = _run("gcl", tmp_path)
    means = analysis["numbers"]
    assert isinstance(means, dict)
    assert any(k.startswith("train/full_contrastive_risk|gcl|16") for k in means["means"])
    assert "full-batch" in str(analysis["headline"])
