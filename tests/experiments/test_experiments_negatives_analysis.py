"""The negatives analysis on result tables with planted answers: a known m*(n) law under large
seed effects and noise, a censored cell, an unidentifiable cell; and the refinement stage."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from crl.errors import CrlValueError
from crl.experiments.metrics import METRICS, metric_spec
from crl.experiments.negatives import NegativesStudy
from crl.experiments.negatives.paper import PAPER
from crl.experiments.negatives.refine import plan_refinement
from crl.experiments.negatives.stats import additive_means, censored_line, estimate_cells
from crl.experiments.negatives.theory import THEORY_FILE, theory_check

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


def _grid_m_star(n: int) -> int:
    threshold = planted_m_star(n) * math.exp(-TOL / SLOPE)
    return min(m for m in (max(1, round(f * n)) for f in FRACTIONS) if m >= threshold * 0.999)


def test_paired_cells_recover_the_planted_m_star_despite_seed_effects() -> None:
    rows = NegativesStudy("quick", data="synthetic")._with_metric(planted_rows())
    cells = {(c.regime, c.n): c for c in estimate_cells(rows, "recall@1", True, TOL)}
    for (regime, n), cell in cells.items():
        if (regime, n) in (("shared", NS[-1]), ("independent", NS[0])):
            continue
        assert cell.status == "located", cell
        # the grid m*, or the next swept m when the noise crosses the tolerance's edge
        step = cell.ms.index(_grid_m_star(n))
        assert cell.m_star in cell.ms[step:step + 2], (cell, _grid_m_star(n))
        truth = planted_m_star(n) * math.exp(-TOL / SLOPE)
        assert cell.lower <= truth <= cell.upper
        # paired by seed: seed levels 20x the noise do not widen the interval past one step
        assert cell.width <= 2.5, cell
    censored = cells[("shared", NS[-1])]
    top = max(round(f * NS[-1]) for f in FRACTIONS if f <= 0.05)
    assert censored.status == "above" and censored.m_star == top
    assert math.isinf(censored.upper)
    flat = cells[("independent", NS[0])]
    assert flat.status == "below" and flat.upper == flat.ms[0]


def test_unpaired_means_would_be_wrong_but_additive_means_are_not() -> None:
    table = np.array([[0.1, 0.2, 0.3], [0.5, 0.6, np.nan]])  # seed 1 is 0.4 better
    assert additive_means(table) == pytest.approx([0.1, 0.2, 0.3], abs=1e-9)


def test_analysis_fits_the_law_with_censoring_and_reports_unidentified_fits(
        study_dir: Path) -> None:
    study = NegativesStudy("smoke", data="synthetic", tolerance=TOL, target_n=16_000)
    analysis = study.analyze(planted_rows(), study_dir)
    laws = analysis.numbers["laws"]
    for regime in ("shared", "independent"):
        assert laws[regime]["alpha"] == pytest.approx(ALPHA, abs=0.12), laws[regime]
        # strictly inside: the point fit is centred in its bootstrap draws, not clamped to an end
        lo, hi = laws[regime]["alpha_ci"]
        assert lo < laws[regime]["alpha"] < hi
    assert laws["shared"]["censored"] == 1 and laws["shared"]["located"] == 4
    assert laws["independent"]["left_out"] == 1 and laws["independent"]["located"] == 4
    # one alpha per regime, with its interval, in the headline; the censored cell in words
    assert analysis.headline.count("m* ~ n^") == 2 and "95% CI" in analysis.headline
    cells_table = next(t for s in analysis.sections for t in s.tables if t.title.startswith(
        "m* per (regime, n)"))
    readings = [row[-1] for row in cells_table.rows]
    assert any(r.startswith("not saturated: m* >= 186") for r in readings)
    assert any(r.startswith("saturated at the smallest swept m") for r in readings)
    # the recommendation at n beyond the sweep is marked as an extrapolation
    recs = {r["regime"]: r for r in analysis.numbers["recommendations"]}
    shared = recs["shared"]
    assert shared["extrapolation"] and shared["low"] < shared["m"] < shared["high"]
    assert shared["m"] == pytest.approx(math.exp(-TOL / SLOPE) * planted_m_star(16_000),
                                        rel=0.5)
    answer = next(s for s in analysis.sections if s.title == "The answer for your n")
    assert "extrapolation" in answer.paragraphs[0] and "n = 16,000" in answer.paragraphs[0]
    # the flat cell's power-law fit is unidentified, never "ok"
    fits = {(f["regime"], f["n"]): f for f in analysis.numbers["critical_m"]["fits"]}
    assert fits[("independent", float(NS[0]))]["reason"]
    assert analysis.numbers["cells_informative"] == len(analysis.numbers["cells"])


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
    assert all(law["reason"] for law in analysis.numbers["laws"].values())


def test_censored_line_treats_bounds_one_sided() -> None:
    x = np.log([100.0, 400.0, 1600.0, 6400.0])
    y = 0.5 * x
    # a lower bound the line already satisfies changes nothing; one above it pulls it up
    a, c = censored_line(x, np.array([*y[:3], y[3] - 1.0]), ["located"] * 3 + ["above"])
    assert (a, c) == pytest.approx((0.5, 0.0), abs=1e-9)
    a2, _ = censored_line(x, np.array([*y[:3], y[3] + 1.0]), ["located"] * 3 + ["above"])
    assert a2 > 0.5
    assert math.isnan(censored_line(x[:2], y[:2], ["located", "above"])[0])


def test_refinement_adds_paired_midpoints_and_seeds_within_budget(tmp_path: Path) -> None:
    coarse = (0.01, 0.1, 1.0)
    rows = [r for r in planted_rows(censored=False, flat=False)
            if any(abs(float(str(r["m_fraction"])) - f) < 1e-9 for f in coarse)]
    study = NegativesStudy("quick", data="synthetic", ns=list(NS), fractions=list(coarse),
                           seeds=list(SEEDS), refine_runs=40)
    cells = estimate_cells(study._with_metric(rows), "recall@1", True, TOL)
    wide = [c for c in cells if c.status == "located" and c.width > 2.5]
    assert wide
    plan = plan_refinement(cells, 40)
    assert 0 < len(plan) <= 40
    for cell in wide[:1]:
        mine = [a for a in plan if (a.regime, a.n) == (cell.regime, cell.n)]
        if mine:
            assert all(cell.lower < a.m < cell.upper for a in mine if a.seed in cell.seeds)
            for m in {a.m for a in mine if a.seed in cell.seeds}:
                assert {a.seed for a in mine if a.m == m} >= set(cell.seeds)  # paired
    assert plan_refinement(cells, 0) == []
    before = {s.run_id for s in study.runs()}
    added = study.refine(rows, tmp_path)
    assert 0 < added <= 40 and (tmp_path / "refinement.json").exists()
    new = [s for s in study.runs() if s.run_id not in before]
    assert len({s.run_id for s in new}) == added and all(s.tags["stage"] == 1 for s in new)
    again = NegativesStudy("quick", data="synthetic", ns=list(NS), fractions=list(coarse),
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


def test_law_point_fit_is_centred_in_its_bootstrap_on_a_coarse_grid() -> None:
    """On the quick preset's coarse m grid a located m* is only known up to a step of 4x; the
    point fit must sit inside its own bootstrap draws (raw quantiles, no clamping), and so must
    the recommendation at a larger n."""
    from crl.experiments.negatives.stats import fit_law

    coarse = (0.01, 0.05, 0.1, 0.4, 1.0)
    rng = np.random.default_rng(3)
    levels = {s: rng.normal(0.3, 0.04) for s in SEEDS}
    rows = []
    for n in NS:
        for fraction in coarse:
            m = max(1, round(fraction * n))
            for s in SEEDS:
                value = levels[s] + SLOPE * min(math.log(m), math.log(0.3 * n))
                rows.append({"run_id": f"shared-{n}-{m}-{s}", "n": n, "m": m, "seed": s,
                             "regime": "shared", "recall@1": value + rng.normal(0, 0.002)})
    cells = estimate_cells(rows, "recall@1", True, TOL)
    law = fit_law("shared", cells)
    alphas = np.array([a for a, _ in law.draws])
    lo, hi = np.quantile(alphas, [0.025, 0.975])
    assert lo < law.alpha < hi, (lo, law.alpha, hi)
    point, low, high = law.predict(20_000)
    values = [math.exp(c + a * math.log(20_000)) for a, c in law.draws]
    q_lo, q_mid, q_hi = np.log(np.quantile(values, [0.025, 0.5, 0.975]))
    assert (math.log(low), math.log(high)) == pytest.approx((q_lo, q_hi))  # not clamped
    # centred: the grid m* (a step's upper end) would sit log 4 / 2 above the draws' median
    assert abs(math.log(point) - q_mid) < 0.15 * (q_hi - q_lo), (point, math.exp(q_mid))
