"""The negatives analysis on result tables with planted answers: a known m*(n) law under large
seed effects and noise, a censored cell, a cell saturated at the smallest m; and the refinement
stage (m* from curves, :mod:`crl.experiments.negatives.curves`)."""

from __future__ import annotations

import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from crl.errors import CrlValueError
from crl.experiments.metrics import METRICS, metric_spec
from crl.experiments.negatives import NegativesStudy
from crl.experiments.negatives.curves import CurveCell, curve_cells
from crl.experiments.negatives.paper import PAPER
from crl.experiments.negatives.refine import RESOLVED_STEP, plan_refinement, resolved
from crl.experiments.negatives.stats import additive_means
from crl.experiments.negatives.theory import THEORY_FILE, theory_check
from crl.experiments.negatives.tolerance import Tolerance

NS = (250, 500, 1000, 2000, 4000)
FRACTIONS = tuple(float(f) for f in np.geomspace(0.01, 1.0, 13))
SEEDS = (0, 1, 2, 3)
ALPHA, C = 0.8, 0.6  # planted m*(n) = C n^ALPHA
SLOPE, TOL = 0.05, 0.01  # recall rises by SLOPE per unit of log m up to m*(n)


@pytest.fixture(scope="module")
def theory_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The exact-model simulation, run once for the module (the smoke preset's small one)."""
    folder = tmp_path_factory.mktemp("theory")
    theory_check(folder, "smoke")
    return folder / THEORY_FILE


@pytest.fixture()
def study_dir(tmp_path: Path, theory_cache: Path) -> Path:
    shutil.copy(theory_cache, tmp_path / THEORY_FILE)
    return tmp_path


def planted_m_star(n: float) -> float:
    return C * n**ALPHA


def planted_rows(*, censored: bool = True, flat: bool = True,
                 seed: int = 0) -> list[dict[str, object]]:
    """recall = level_s + SLOPE * min(log m, log m*(n)) + noise, with seed levels 20x the noise
    (shared across m: the comparison must be paired). The grid m* is the smallest swept m at or
    above m*(n) e^(-TOL / SLOPE). Shared n = 4000 is swept only up to 5% of n, below its m*
    (censored: gains still rising); independent n = 250 does not move with m (flat: saturated at
    the smallest m, no power law)."""
    rng = np.random.default_rng(seed)
    levels = {s: rng.normal(0.3, 0.04) for s in SEEDS}
    rows: list[dict[str, object]] = []
    for regime in ("shared", "independent"):
        for n in NS:
            m_star = planted_m_star(n)
            for fraction in FRACTIONS:
                if censored and regime == "shared" and n == NS[-1] and fraction > 0.05:
                    continue  # the sweep stops below m*(n): gains still rising at its top
                m = max(1, round(fraction * n))
                for s in SEEDS:
                    value = levels[s] + SLOPE * min(math.log(m), math.log(m_star))
                    if flat and regime == "independent" and n == NS[0]:
                        value = levels[s]
                    value += rng.normal(0, 0.002)
                    rows.append({"run_id": f"{regime}-{n}-{m}-{s}", "n": n, "m": m,
                                 "m_fraction": fraction, "regime": regime, "seed": s,
                                 "retrieval/x2y_recall@1": value,
                                 "retrieval/y2x_recall@1": value})
    return rows


def test_paired_cells_recover_the_planted_m_star_despite_seed_effects() -> None:
    rows = NegativesStudy("quick", data="synthetic")._with_metric(planted_rows())
    cells = {(c.regime, c.n): c for c in curve_cells(rows, "recall@1", True, Tolerance(TOL))}
    for (regime, n), cell in cells.items():
        if (regime, n) in (("shared", NS[-1]), ("independent", NS[0])):
            continue
        assert cell.status == "located" and cell.m_star is not None, cell
        # The curve is linear in log m up to m*(n), so it comes within TOL of its top at
        # m*(n) e^(-TOL / SLOPE); the seeds' interval holds that up to the grid's own step.
        truth = planted_m_star(n) * math.exp(-TOL / SLOPE)
        assert cell.lower / cell.resolution <= truth <= cell.upper * cell.resolution
        # paired by seed: seed levels 20x the noise do not widen the interval past one step
        assert cell.upper / cell.lower <= cell.resolution, cell
        assert cell.exact and cell.num_resamples == 35  # every multiset of 4 seeds
    censored = cells[("shared", NS[-1])]
    top = max(round(f * NS[-1]) for f in FRACTIONS if f <= 0.05)
    assert censored.status == "above" and censored.m_star is None
    assert censored.lower <= top and math.isinf(censored.upper)
    flat = cells[("independent", NS[0])]
    assert flat.status == "below" and flat.upper == flat.ms[0]


def test_unpaired_means_would_be_wrong_but_additive_means_are_not() -> None:
    table = np.array([[0.1, 0.2, 0.3], [0.5, 0.6, np.nan]])  # seed 1 is 0.4 better
    assert additive_means(table) == pytest.approx([0.1, 0.2, 0.3], abs=1e-9)


def test_analysis_fits_the_law_with_censoring_and_tests_it(study_dir: Path) -> None:
    study = NegativesStudy("smoke", data="synthetic", tolerance=TOL, target_n=16_000)
    analysis = study.analyze(planted_rows(), study_dir)
    laws = analysis.numbers["laws"]
    # independent n = 250 does not move with m: as an upper bound m* <= 3 it breaks the law,
    # which says so; without it the located cells recover the planted alpha
    assert laws["independent"]["verdict"] == "does not fit"
    located = analysis.numbers["laws_without_censored"]
    for regime, law in (("shared", laws["shared"]), ("independent", located["independent"])):
        assert law["verdict"] == "fits", (regime, law)
        lo, hi = law["alpha_ci"]
        assert lo < ALPHA < hi and law["alpha"] == pytest.approx(ALPHA, abs=0.12), law
        assert len(law["residuals"]) == len(NS) - (regime == "independent")
    # the censored cells enter as bounds, and the fit without them is reported too
    assert laws["shared"]["censored"] == 1 and laws["shared"]["located"] == 4
    assert laws["independent"]["censored"] == 1 and laws["independent"]["located"] == 4
    assert analysis.numbers["laws_without_censored"]["shared"]["censored"] == 0
    # the headline names the tolerance and each regime's law against its own prediction
    assert f"within {TOL:g} of the best" in analysis.headline
    assert analysis.headline.count("m* ~ n^") == 1
    assert "against the theory's 1" in analysis.headline
    assert "independent: one power law does not describe these cells" in analysis.headline
    cells_table = next(t for s in analysis.sections for t in s.tables if t.title.startswith(
        "m* per (regime, n)"))
    assert {row[-1] for row in cells_table.rows} == {"located", "above", "below"}
    # the recommendation at n beyond the sweep is marked as an extrapolation, with its budget
    shared = analysis.numbers["recommendations"]["shared"]
    assert shared["source"] == "law" and shared["extrapolation"]
    assert shared["low"] < shared["m"] < shared["high"]
    assert shared["m"] == pytest.approx(math.exp(-TOL / SLOPE) * planted_m_star(16_000),
                                        rel=0.5)
    answer = next(s for s in analysis.sections if s.title == "The answer for your n")
    first = answer.paragraphs[1]  # after the convention for m
    assert "extrapolation" in first and "n = 16,000" in first
    assert "samples per run" in first and "epochs" in first
    assert "a batch of about" in first  # shared: in the user's units
    # half and twice the tolerance
    assert [s["tolerance_value"] for s in analysis.numbers["sensitivity"]] == \
        pytest.approx([TOL / 2, TOL, 2 * TOL])
    # the flat cell's power-law fit is unidentified, never "ok"
    fits = {(f["regime"], f["n"]): f for f in analysis.numbers["critical_m"]["fits"]}
    assert fits[("independent", float(NS[0]))]["reason"]


def test_a_cell_off_the_law_falls_back_to_the_nearest_measured_cell(study_dir: Path) -> None:
    rows = planted_rows(censored=False, flat=False)
    for r in rows:  # independent n = 2000 saturates at 1% of n: far below its law
        if r["regime"] == "independent" and r["n"] == NS[3]:
            level = float(str(r["retrieval/x2y_recall@1"])) - SLOPE * min(
                math.log(float(str(r["m"]))), math.log(planted_m_star(NS[3])))
            value = level + SLOPE * min(math.log(float(str(r["m"]))), math.log(20.0))
            r["retrieval/x2y_recall@1"] = r["retrieval/y2x_recall@1"] = value
    study = NegativesStudy("smoke", data="synthetic", tolerance=TOL, target_n=2200)
    analysis = study.analyze(rows, study_dir)
    assert analysis.numbers["laws"]["independent"]["verdict"] == "does not fit"
    rec = analysis.numbers["recommendations"]["independent"]
    assert rec["source"] == "nearest cell" and rec["n_used"] == NS[3]
    assert "independent: one power law does not describe these cells" in analysis.headline
    assert analysis.numbers["verdicts"]["independent"]["verdict"] == "cannot tell"


def test_report_speaks_in_the_papers_units_and_cites_it(study_dir: Path) -> None:
    study = NegativesStudy("smoke", data="synthetic", tolerance=TOL)
    analysis = study.analyze(planted_rows(), study_dir)
    comparison = " ".join(next(s for s in analysis.sections
                               if s.title == "Comparison with the paper").paragraphs)
    assert PAPER.citation in comparison and "points" in comparison
    gains = next(t for s in analysis.sections for t in s.tables if "gains in points" in t.title)
    assert all("%" in c or c in ("regime", "n") or "points" in c for c in gains.columns)
    for name in ("metric_vs_m.png", "m_star_vs_n.png", "independent_minus_shared.png"):
        assert (study_dir / "plots" / name).stat().st_size > 10_000


def test_a_sweep_where_m_never_matters_says_so(study_dir: Path) -> None:
    rows = planted_rows(censored=False, flat=False)
    for r in rows:
        r["retrieval/x2y_recall@1"] = r["retrieval/y2x_recall@1"] = 0.02 + 0.001 * int(
            str(r["seed"]))
    analysis = NegativesStudy("smoke", data="synthetic").analyze(rows, study_dir)
    assert analysis.headline.startswith("On this data and budget the number of negatives made "
                                        "no measurable difference")
    assert all(law["verdict"] == "untested" for law in analysis.numbers["laws"].values())


COARSE = (0.01, 0.1, 1.0)


def _coarse_cells(*, censored: bool, refine_runs: int
                  ) -> tuple[NegativesStudy, list[dict[str, object]], list[CurveCell]]:
    """The planted rows at three fractions (steps of 10x), their study and curve cells."""
    rows = [r for r in planted_rows(censored=censored, flat=False)
            if any(abs(float(str(r["m_fraction"])) - f) < 1e-9 for f in COARSE)]
    study = NegativesStudy("quick", data="synthetic", ns=list(NS), fractions=list(COARSE),
                           seeds=list(SEEDS), refine_runs=refine_runs)
    return study, rows, curve_cells(study._with_metric(rows), "recall@1", True, Tolerance(TOL))


def test_refinement_goes_where_the_interval_is_widest_with_paired_seeds(tmp_path: Path
                                                                       ) -> None:
    study, rows, cells = _coarse_cells(censored=False, refine_runs=40)
    widest = max(cells, key=lambda c: c.width_log)
    plan = plan_refinement(cells, 40)
    assert 0 < len(plan) <= 40
    mine = [a for a in plan if (a.regime, a.n) == (widest.regime, widest.n)]
    assert mine, (widest, plan)
    for m in {a.m for a in mine}:
        assert {a.seed for a in plan if a.m == m and a.n == widest.n} == set(SEEDS)  # paired
        assert m not in widest.ms
    assert {a.seed for a in plan} == set(SEEDS)  # no regime gets seeds the other lacks
    assert plan_refinement(cells, 0) == []
    before = {s.run_id for s in study.runs()}
    added = study.refine(rows, tmp_path)
    assert 0 < added <= 40 and (tmp_path / "refinement.json").exists()
    new = [s for s in study.runs() if s.run_id not in before]
    assert len({s.run_id for s in new}) == added and all(s.tags["stage"] == 1 for s in new)
    again = NegativesStudy("quick", data="synthetic", ns=list(NS), fractions=list(COARSE),
                           seeds=list(SEEDS), refine_runs=40)
    again.load_state(tmp_path)  # a rebuilt study (crl report) sees the added runs
    assert {s.run_id for s in again.runs()} == {s.run_id for s in study.runs()}
    assert study.refine(rows, tmp_path) == 0 or len(study.added) <= 40


def test_every_metric_declares_its_direction() -> None:
    assert metric_spec("recall@1").higher_is_better
    assert not metric_spec("risk/contrastive").higher_is_better
    assert not metric_spec("retrieval/x2y_mean_rank").higher_is_better
    assert all(isinstance(s.higher_is_better, bool) for s in METRICS.values())
    with pytest.raises(CrlValueError, match="no declared direction"):
        metric_spec("accuracy_of_something")
    with pytest.raises(CrlValueError, match="no declared direction"):
        NegativesStudy("smoke", data="synthetic", metric="my_loss")


def test_refinement_stops_where_the_grid_is_finer_than_the_resolved_step() -> None:
    # a located cell whose swept m around m* are <= 1.25x apart gets no more m, however wide
    # the seeds make its interval: more m cannot narrow a spread over seeds; a censored or a
    # coarsely swept cell still does
    _, _, cells = _coarse_cells(censored=True, refine_runs=400)
    located = [c for c in cells if c.status == "located"]
    censored = [c for c in cells if c.status != "located"]
    assert located and censored
    for cell in located:  # the grid step (10x) limits these: refined
        assert cell.resolution > RESOLVED_STEP and not resolved(cell)
        assert any((a.regime, a.n) == (cell.regime, cell.n)
                   for a in plan_refinement([cell], 400))
    fine = [replace(c, resolution=1.2, lower=c.m_star / 3 if c.m_star else c.lower,
                    upper=3 * (c.m_star or c.upper)) for c in located]
    assert all(resolved(c) and c.width_log > math.log(RESOLVED_STEP) for c in fine)
    assert plan_refinement(fine, 400) == []  # wide, but the seeds', not the grid's
    assert plan_refinement(fine, 400, step=1.1)  # a finer target refines them again
    for cell in censored:
        assert not resolved(replace(cell, resolution=1.01))
        assert plan_refinement([replace(cell, resolution=1.01)], 400)
