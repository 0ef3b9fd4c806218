"""m* read from fitted curves (crl.experiments.negatives.curves): planted answers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from crl.errors import CrlValueError
from crl.experiments.negatives import curves
from crl.experiments.negatives.curvefit import pava, saturating
from crl.experiments.negatives.curves import (
    curve_cells,
    estimate_curve_cell,
    read_m_star,
    where_to_refine,
)
from crl.experiments.negatives.resample import num_multisets, seed_resamples, weighted_quantile
from crl.experiments.negatives.tolerance import Tolerance
from negatives_planted import planted_table

MS = [10.0, 20, 40, 80, 160, 320, 640, 1280]


def _cell(table: np.ndarray, tolerance: Tolerance = Tolerance(0.01), n: int = 1280,
          ms: list[float] = MS, **kw: int) -> curves.CurveCell:
    return estimate_curve_cell("shared", n, tuple(ms), tuple(range(table.shape[0])), table,
                               tolerance, rng=np.random.default_rng(0), **kw)


@pytest.mark.parametrize("text, value, relative", [("0.01", 0.01, False), (" 2% ", 0.02, True),
                                                   ("0", 0.0, False), (0.005, 0.005, False)])
def test_tolerance_parses_points_and_percentages(text: str | float, value: float,
                                                 relative: bool) -> None:
    tol = Tolerance.parse(text)
    assert (tol.value, tol.relative) == (pytest.approx(value), relative)


@pytest.mark.parametrize("text", ["abc", "-0.01", "150%", "nan", "%", "1e400"])
def test_bad_tolerance_names_the_option(text: str) -> None:
    with pytest.raises(CrlValueError, match="--tolerance"):
        Tolerance.parse(text)


def test_relative_tolerance_is_a_share_of_the_best() -> None:
    table = planted_table(MS, 200.0, seeds=3, noise=0.0, rng=np.random.default_rng(1))
    absolute = _cell(table, Tolerance(0.01))
    relative = _cell(table, Tolerance(0.02, relative=True))  # 2% of a plateau near 0.5
    best = absolute.curve.at(MS[-1])
    assert relative.tolerance_points == pytest.approx(0.02 * best)
    assert absolute.m_star is not None and relative.m_star is not None
    # A tolerance of 2% of ~0.48 is a little under 0.01, so m* a little larger.
    assert (relative.m_star > absolute.m_star) == (0.02 * best < 0.01)
    again = _cell(table, Tolerance(0.01 / best, relative=True))
    assert again.m_star == pytest.approx(absolute.m_star, rel=1e-9)


def test_exact_enumeration_counts_and_weights() -> None:
    for s in (1, 2, 3, 4, 6):
        counts, weights, exact = seed_resamples(s, np.random.default_rng(0))
        assert exact and len(counts) == num_multisets(s)
        assert weights.sum() == pytest.approx(1.0) and (counts.sum(axis=1) == s).all()
    counts, weights, exact = seed_resamples(8, np.random.default_rng(0))  # 6,435 > 2,000
    assert not exact and len(counts) == 2000


def test_exact_enumeration_equals_brute_force() -> None:
    """All S^S ordered resamples with equal weight give the same interval as the weighted
    multisets."""
    rng = np.random.default_rng(3)
    table = planted_table(MS, 150.0, seeds=4, noise=0.004, rng=rng)
    cell = _cell(table)
    grid = np.asarray(MS)
    lo, hi = [], []
    for pick in itertools.product(range(4), repeat=4):
        r = curves._reading(table[list(pick)], grid, 1280, cell.method, Tolerance(0.01))
        lo.append(r.lower)
        hi.append(r.upper)
    w = np.full(len(lo), 1 / len(lo))
    assert cell.exact and cell.num_resamples == 35
    assert cell.lower == pytest.approx(min(cell.m_star or math.inf,
                                           weighted_quantile(np.array(lo), w, 0.025)))
    assert cell.upper == pytest.approx(max(cell.m_star or 0.0,
                                           weighted_quantile(np.array(hi), w, 0.975)))


def test_interpolated_m_star_recovers_a_planted_value_off_the_grid() -> None:
    table = planted_table(MS, 230.0, seeds=5, noise=0.001, rng=np.random.default_rng(4),
                          seed_spread=0.1)  # large seed levels: paired by seed
    cell = _cell(table)
    assert cell.status == "located" and cell.method == "saturating"
    assert cell.m_star is not None and cell.m_star not in MS
    assert cell.lower <= 230.0 <= cell.upper
    assert cell.m_star == pytest.approx(230.0, rel=0.15)
    assert cell.resolution == pytest.approx(2.0)  # 160 -> 320 holds m*
    noiseless = _cell(planted_table(MS, 230.0, seeds=3, noise=0.0,
                                    rng=np.random.default_rng(5)))
    assert noiseless.m_star == pytest.approx(230.0, rel=1e-4)


def test_non_monotone_curve_is_pooled_by_the_isotonic_fit() -> None:
    """A curve that dips before it rises (shared sets at small m): the saturating form does
    not fit, the isotonic fit pools the dip, and m* is read where the fit crosses."""
    curve = np.array([0.05, 0.03, 0.03, 0.06, 0.10, 0.12, 0.121, 0.121])
    rng = np.random.default_rng(6)
    table = curve[None, :] + rng.normal(0, 0.02, (4, 1)) + rng.normal(0, 0.0005, (4, 8))
    cell = _cell(table)
    assert cell.method == "isotonic" and "does not fit" in cell.method_reason
    assert np.all(np.diff(cell.fitted) >= 0)
    assert cell.status == "located" and cell.m_star is not None
    assert 160 < cell.m_star < 320
    # Linear in log m between 160 (0.10) and 320 (0.12): level 0.111 -> 160 * 2^0.55.
    assert cell.m_star == pytest.approx(160 * 2 ** 0.55, rel=0.05)


def test_pava_is_the_least_squares_monotone_fit() -> None:
    rng = np.random.default_rng(7)
    y, w = rng.normal(size=9), rng.uniform(0.5, 2, size=9)
    fit = pava(y, w)
    assert np.all(np.diff(fit) >= -1e-12)
    from sklearn.isotonic import IsotonicRegression
    ref = IsotonicRegression().fit(np.arange(9), y, sample_weight=w).predict(np.arange(9))
    assert fit == pytest.approx(ref)


def test_saturating_fit_recovers_its_parameters() -> None:
    ms = np.array(MS)
    fit = saturating(ms, 0.4 - 0.3 * (ms / 10) ** -0.5, np.ones(len(ms)))
    assert fit is not None
    assert (fit.plateau, fit.gap, fit.beta) == (pytest.approx(0.4), pytest.approx(0.3),
                                                pytest.approx(0.5, abs=1e-6))


def test_flat_curve_is_censored_below_without_a_point() -> None:
    table = 0.3 + np.random.default_rng(8).normal(0, 0.001, (3, 8))
    cell = _cell(table)
    assert cell.status == "below" and cell.m_star is None
    assert (cell.lower, cell.upper) == (0.0, MS[0]) and "m* <= 10" in cell.reason


def test_curve_rising_into_the_last_step_is_censored_above() -> None:
    curve = np.log(np.array(MS)) / 10  # rises by 0.069 per step: never within 0.01 before
    table = curve[None, :] + np.random.default_rng(9).normal(0, 0.0005, (3, 8))
    reached = _cell(table)  # the grid reaches n: m* in the last step
    assert reached.status == "above" and reached.m_star is None
    assert (reached.lower, reached.upper) == (640.0, 1280.0)
    short = _cell(table, n=10_000)  # the grid stops short of n - 1: no upper bound
    assert short.status == "above" and math.isinf(short.upper)


def test_short_grid_with_a_rising_top_is_a_lower_bound() -> None:
    ms = (10.0, 20.0, 40.0, 80.0)
    fit = curves.isotonic(np.array(ms), np.array([0.1, 0.2, 0.25, 0.252]), np.ones(4))
    assert read_m_star(fit, ms, 80, Tolerance(0.01)).status == "located"
    reading = read_m_star(fit, ms, 1000, Tolerance(0.01))
    assert reading.status == "above" and reading.m_star is None and reading.lower > 20


def test_many_seeds_use_draws_deterministically() -> None:
    table = planted_table(MS, 150.0, seeds=8, noise=0.003, rng=np.random.default_rng(10))
    a, b = _cell(table), _cell(table)
    assert not a.exact and a.num_resamples == 2000 and (a.lower, a.upper) == (b.lower, b.upper)


def test_where_to_refine_picks_the_widest_cell_and_pairs_seeds() -> None:
    rng = np.random.default_rng(11)
    rows = []
    for regime, noise, seeds in (("shared", 0.0005, 3), ("independent", 0.01, 5)):
        table = planted_table(MS, 150.0, seeds=seeds, noise=noise, rng=rng)
        rows += [{"regime": regime, "n": 1280, "m": int(m), "seed": s, "score": table[s, j]}
                 for s in range(seeds) for j, m in enumerate(MS)]
    cells = curve_cells(rows, "score", True, Tolerance(0.01))
    plan = where_to_refine(cells)
    widest = max(cells, key=lambda c: c.width_log)
    assert plan is not None and (plan.regime, plan.n) == (widest.regime, widest.n)
    assert plan.seeds == (0, 1, 2, 3, 4)  # both regimes get every seed
    lo = widest.lower if plan.cause != "grid step" else 0
    assert all(lo <= m <= max(widest.upper, 1280) and m not in MS for m in plan.ms)
    assert plan.width_log == pytest.approx(widest.width_log)


def _two_speed(ms: list[float], n: int) -> np.ndarray:
    """A rise that is steep at small m and creeps near the top (not one saturating form)."""
    x = np.log(n / np.asarray(ms))
    return 0.40 - 0.004 * x - 0.05 * np.maximum(x - 1.5, 0.0) ** 2


def test_a_grid_dense_around_m_star_is_read_on_its_means_whatever_lies_below() -> None:
    """Swept m at most 1.25x apart around m*: the isotonic reading, which depends only on the
    means near m*, so a second study that also swept m far below reads the same m*
    (the quick and full presets' verify stages: docs/negatives.md, "The statistics")."""
    n = 16_000
    near = [1600.0, 2000, 2400, 2900, 3500, 4200, 5000, 6000, 16_000]
    far = [50.0, 100, 200, 400, 800]
    rng = np.random.default_rng(0)
    table = _two_speed(near, n)[None, :] + rng.normal(0, 0.003, (4, len(near)))
    low = _two_speed(far, n)[None, :] + rng.normal(0, 0.003, (4, len(far)))
    dense = _cell(table, n=n, ms=near)
    assert dense.method == "isotonic" and "at most 1.25x" in dense.method_reason
    assert dense.lack_of_fit is not None  # the saturating form's test is still reported
    assert dense.status == "located" and dense.m_star is not None
    assert 2400 < dense.m_star < 3500 and dense.resolution <= curves.RESOLVED_STEP
    wide = _cell(np.hstack([low, table]), n=n, ms=far + near)
    assert wide.method == "isotonic" and wide.m_star == pytest.approx(dense.m_star, rel=1e-12)


def test_a_coarse_grid_keeps_the_saturating_form_between_its_steps() -> None:
    """Doubling steps around m*: the isotonic fit would interpolate across a factor of 2, so
    the saturating form reads between them where it fits (as before)."""
    table = planted_table(MS, 230.0, seeds=5, noise=0.001, rng=np.random.default_rng(4),
                          seed_spread=0.1)
    method, why, test = curves.choose_reading(table, np.array(MS), 1280, Tolerance(0.01))
    assert (method, test is not None) == ("saturating", True) and "fits" in why
