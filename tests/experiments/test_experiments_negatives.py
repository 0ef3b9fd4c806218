"""The negatives study: its grid, its analysis on tables with known answers, and a smoke run
through the CLI with resume and a report rebuilt from files."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from crl.cli import app
from crl.errors import CrlValueError
from crl.experiments import get_study
from crl.experiments.negatives import FRACTIONS_FULL, NegativesStudy

runner = CliRunner()


def test_quick_grid_meets_the_study_design() -> None:
    study = get_study("negatives", preset="quick", data="pycode")
    specs = study.runs()
    ns = sorted({s.tags["n"] for s in specs})
    assert len(ns) >= 3 and ns[-1] / ns[0] >= 8
    assert sorted({s.tags["m_fraction"] for s in specs}) == sorted(FRACTIONS_FULL)
    assert {s.tags["regime"] for s in specs} == {"shared", "independent"}
    assert len({s.tags["seed"] for s in specs}) >= 2
    # one batch size and one budget of processed samples for every run: m is its own axis
    assert len({s.config["train"]["batch_size"] for s in specs}) == 1
    assert len({s.config["train"]["max_samples"] for s in specs}) == 1
    assert {s.config["loss"]["name"] for s in specs} == {"gcl"}
    for s in specs:
        assert s.config["negatives"]["m"] == max(1, round(s.tags["m_fraction"] * s.tags["n"]))
        assert s.config["data"]["num_train"] == s.tags["n"]
    # m = n means every other sample in both regimes: the two specs share one run
    shared_runs = len(ns) * len({s.tags["seed"] for s in specs})
    assert len({s.run_id for s in specs}) == len(specs) - shared_runs
    for s in specs:
        twin = [t for t in specs if t.run_id == s.run_id]
        assert len(twin) == (2 if s.tags["m"] >= s.tags["n"] - 1 else 1)


def test_bad_data_and_preset_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CrlValueError, match="preset"):
        get_study("negatives", preset="huge")
    with pytest.raises(CrlValueError, match="--data"):
        NegativesStudy("smoke", data="cifar10")
    with pytest.raises(CrlValueError, match="does not exist"):
        NegativesStudy("smoke", data=str(tmp_path / "missing.npz"))
    with pytest.raises(CrlValueError, match="unknown study"):
        get_study("nope")


def _known_rows(alpha: float, beta: float, seed: int = 0) -> list[dict[str, float | str]]:
    """recall = 0.8 - A m^-beta with A chosen so that m*(n; 0.01) = 0.3 n^alpha exactly."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, float | str]] = []
    for n in (400, 1600, 6400):
        m_star = 0.3 * n**alpha
        amplitude = 0.01 * m_star**beta
        for fraction in FRACTIONS_FULL:
            m = max(1, round(fraction * n))
            for regime in ("shared", "independent"):
                for s in (0, 1):
                    value = 0.8 - amplitude * m ** (-beta) + rng.normal(0, 2e-4)
                    rows.append({"n": n, "m": m, "m_fraction": fraction, "regime": regime,
                                 "seed": s, "retrieval/x2y_recall@1": value,
                                 "retrieval/y2x_recall@1": value})
    return rows


def test_analysis_recovers_known_exponents(tmp_path: Path) -> None:
    study = NegativesStudy("quick", data="synthetic", tolerance=0.01)
    analysis = study.analyze(_known_rows(alpha=0.75, beta=0.5), tmp_path)
    fitted = analysis.numbers["critical_m"]
    for regime in ("shared", "independent"):
        assert fitted["regimes"][regime]["alpha"] == pytest.approx(0.75, abs=0.1)
    betas = [f["beta"] for f in fitted["fits"]]
    assert np.allclose(betas, 0.5, atol=0.1)
    for f in fitted["fits"]:
        assert f["m_star"] == pytest.approx(0.3 * f["n"] ** 0.75, rel=0.3)
    assert "m* ≈" in analysis.headline
    grid = analysis.numbers["grid_saturation"]
    assert {c["regime"] for c in grid["cells"]} == {"shared", "independent"}
    for cell in grid["cells"]:  # the true m* = 0.3 n^0.75 lies between swept values
        assert cell["m_star_ci"][0] <= cell["m_star"] <= cell["m_star_ci"][1]
    for name in ("metric_vs_m.png", "m_star_vs_n.png", "independent_minus_shared.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 10_000
    gains = {(g["regime"], g["n"]): g for g in analysis.numbers["gains"]}
    assert gains[("shared", 400)]["gain_10_to_40"] > 0


def test_digits_defaults_to_the_class_level_knn_metric() -> None:
    # Instance recall@1 of two augmented views stays near chance on digits; kNN accuracy moves.
    study = NegativesStudy("smoke", data="digits")
    assert study.metric == "probe/knn_acc"
    assert all(spec.config["eval"]["probe"] for spec in study.runs())
    pycode = NegativesStudy("smoke")
    assert pycode.metric == "recall@1"
    assert not any(spec.config["eval"]["probe"] for spec in pycode.runs())
    with pytest.raises(CrlValueError, match="needs labelled data"):
        NegativesStudy("smoke", metric="probe/knn_acc")


def _flat_rows(flat_regime: str | None) -> list[dict[str, float | str]]:
    """recall@1 near chance that m does not move beyond seed noise (0.004 < tolerance), in
    ``flat_regime`` (None: both) and clear gains up to m = 0.4 n in the other regime."""
    rng = np.random.default_rng(1)
    rows: list[dict[str, float | str]] = []
    for n in (400, 1600, 6400):
        for fraction in FRACTIONS_FULL:
            m = max(1, round(fraction * n))
            for regime in ("shared", "independent"):
                for s in (0, 1):
                    if flat_regime in (None, regime):
                        value = 0.02 + rng.uniform(-0.002, 0.002)
                    else:
                        value = 0.3 + 0.2 * min(fraction, 0.4)
                    rows.append({"n": n, "m": m, "m_fraction": fraction, "regime": regime,
                                 "seed": s, "retrieval/x2y_recall@1": value,
                                 "retrieval/y2x_recall@1": value})
    return rows


def test_a_metric_that_m_does_not_move_is_reported_as_such(tmp_path: Path) -> None:
    # Noise-level differences must not be read as "gains stop at the smallest m".
    study = NegativesStudy("quick", data="synthetic", tolerance=0.01)
    analysis = study.analyze(_flat_rows(None), tmp_path)
    assert analysis.headline.startswith("On this data and budget the number of negatives made "
                                        "no measurable difference")
    assert "m* ≈" not in analysis.headline
    grid = analysis.numbers["grid_saturation"]
    assert all(c["flat"] and c["gain"] <= 0.01 for c in grid["cells"])
    assert grid["regimes"] == {}  # no alpha from cells that do not locate m*


def test_flat_cells_are_left_out_of_the_headline_and_alpha(tmp_path: Path) -> None:
    study = NegativesStudy("quick", data="synthetic", tolerance=0.01)
    analysis = study.analyze(_flat_rows("shared"), tmp_path)
    grid = analysis.numbers["grid_saturation"]
    flat = {(c["regime"], c["n"]) for c in grid["cells"] if c["flat"]}
    assert flat == {("shared", n) for n in (400, 1600, 6400)}
    assert set(grid["regimes"]) == {"independent"}
    for c in grid["cells"]:
        if c["regime"] == "independent":  # gains up to 0.4 n, flat after
            assert c["m_star_over_n"] == pytest.approx(0.4, abs=0.01)
    assert "m* ≈ 0.40 n" in analysis.headline
    assert "No measurable gain from more negatives in shared n = 400" in analysis.headline


def _summaries(study_dir: Path) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime_ns for p in study_dir.glob("*/summary.json")}


def _without_timings(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return [{k: v for k, v in row.items() if not k.startswith("time/")}
                for row in csv.DictReader(handle)]


def test_smoke_study_through_the_cli_resumes_and_rebuilds(tmp_path: Path) -> None:
    args = ["study", "negatives", "--preset", "smoke", "--data", "synthetic", "--out",
            str(tmp_path), "--workers", "1", "--no-progress"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    study_dir = tmp_path / "negatives"
    assert "report:" in result.output
    done = _summaries(study_dir)
    specs = get_study("negatives", preset="smoke", data="synthetic").runs()
    assert set(done) == {s.run_id for s in specs}
    with open(study_dir / "results.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(specs)
    assert {"n", "m", "regime", "seed", "retrieval/x2y_recall@1"} <= set(table[0])
    first = _without_timings(study_dir / "results.csv")

    # A half-done study: one run lost its summary (killed before the end). The re-run redoes
    # exactly that run, and the results are the same.
    victim = sorted(done)[3]
    (study_dir / victim / "summary.json").unlink()
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    again = _summaries(study_dir)
    assert {k for k in again if again[k] != done.get(k)} == {victim}
    assert _without_timings(study_dir / "results.csv") == first

    # The report is rebuilt from the files alone.
    (study_dir / "report.html").unlink()
    for png in (study_dir / "plots").glob("*.png"):
        png.unlink()
    result = runner.invoke(app, ["report", str(study_dir)])
    assert result.exit_code == 0, result.output
    page = (study_dir / "report.html").read_text()
    assert "data:image/png;base64," in page and "crl study negatives --preset smoke" in page
    analysis = json.loads((study_dir / "analysis.json").read_text())
    assert analysis["numbers"]["metric"] == "recall@1"
    assert all(math.isfinite(x) for x in analysis["numbers"]["theory_inner_error"]["m"])


def test_report_of_a_non_study_directory_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a study directory" in result.output
