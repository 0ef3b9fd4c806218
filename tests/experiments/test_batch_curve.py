"""Planted answers for B* (crl.experiments.batch.curve): a known curve with noise, a fall past
the best (the fixed budget's fewer steps), censored readings, a curve that never saturates, and
the refinement it plans."""

from __future__ import annotations

import math

import numpy as np
import pytest

from crl.experiments.batch.analysis import b_text, sensitivity
from crl.experiments.batch.curve import b_star, batch_table, estimate_b_star, read_b_star
from crl.experiments.metrics import metric_spec
from crl.experiments.negatives.curvefit import Isotonic, Saturating
from crl.experiments.negatives.refine import plan_refinement
from crl.experiments.negatives.tolerance import Tolerance

BS = (8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)
N = 4000
TOL = Tolerance(0.01)


def planted(b: float, *, peak: float = 256.0) -> float:
    """Rises as 0.5 - 0.2 (B / 8)^-0.6 up to ``peak``, then falls 0.05 per doubling."""
    rise = 0.5 - 0.2 * (min(b, peak) / 8.0) ** -0.6
    return rise - 0.05 * max(0.0, math.log2(b / peak))


def planted_b_star(peak: float = 256.0, tol: float = 0.01) -> float:
    """The smallest B where the rising part comes within ``tol`` of its value at ``peak``."""
    level = planted(peak, peak=peak) - tol
    return 8.0 * (0.2 / (0.5 - level)) ** (1 / 0.6)


def rows_of(table: np.ndarray, bs: tuple[float, ...] = BS) -> list[dict[str, object]]:
    return [{"batch_size": int(b), "seed": s, "recall@1": float(table[s, j])}
            for s in range(table.shape[0]) for j, b in enumerate(bs)
            if math.isfinite(table[s, j])]


def test_a_noiseless_saturating_rise_gives_the_planted_b_star_exactly() -> None:
    # Seed effects only (additive): the seed-adjusted means are the curve itself.
    table = np.array([[planted(b) + off for b in BS] for off in (0.0, 0.01, -0.02)])
    cell = estimate_b_star(N, BS, (0, 1, 2), table, TOL, rng=np.random.default_rng(0))
    assert cell.status == "located"
    assert cell.method == "saturating"
    assert cell.m_star == pytest.approx(planted_b_star(), rel=1e-5)
    assert (cell.lower, cell.upper) == pytest.approx((cell.m_star, cell.m_star), rel=1e-5)
    assert cell.exact and cell.num_resamples == 10  # C(5, 3) multisets of 3 seeds
    assert cell.resolution == 2.0
    # the fall past the best is not fitted: the curve stops at B = 256
    assert all(math.isnan(f) for f in cell.fitted[6:])
    assert not any(math.isnan(f) for f in cell.fitted[:6])


def test_noisy_seeds_cover_the_planted_b_star() -> None:
    # 20 studies of 4 seeds (35 exact resamples each): a seed bootstrap of few seeds covers
    # less than its nominal 95%, but most of the time, and never by the grid's whole width.
    truth, covered = planted_b_star(), 0
    for rep in range(20):
        rng = np.random.default_rng(100 + rep)
        table = np.array([[planted(b) + off + rng.normal(0, 0.003) for b in BS]
                          for off in rng.normal(0, 0.02, size=4)])
        cell = estimate_b_star(N, BS, (0, 1, 2, 3), table, TOL, rng=np.random.default_rng(0))
        assert cell.status == "located" and cell.m_star is not None
        assert cell.exact and cell.num_resamples == 35
        assert cell.upper / cell.lower < 4  # seeds' noise, not the whole grid
        covered += cell.lower <= truth <= cell.upper
    assert covered >= 14


def test_the_falling_tail_is_not_pooled_into_the_plateau() -> None:
    # A peak at B = 64 and a steep fall: the best is 64, B* at or below it.
    table = np.array([[planted(b, peak=64.0) for b in BS]] * 2)
    cell = estimate_b_star(N, BS, (0, 1), table, TOL, rng=np.random.default_rng(0))
    assert cell.status == "located" and cell.m_star is not None
    assert cell.m_star <= 64.0
    # the isotonic fit over the whole grid would pool the fall and read a smaller B*
    iso = Isotonic(BS, tuple(float(v) for v in np.maximum.accumulate(table[0])))
    assert iso.at(1024.0) == pytest.approx(planted(64.0, peak=64.0))


def test_a_flat_curve_is_censored_below_the_grid() -> None:
    table = np.array([[0.30 + 0.001 * j + off for j in range(len(BS))] for off in (0.0, 0.01)])
    cell = estimate_b_star(N, BS, (0, 1), table, TOL, rng=np.random.default_rng(0))
    assert cell.status == "below"
    assert cell.m_star is None
    assert cell.upper == BS[0]
    assert "B* <= 8" in cell.reason
    assert b_text(cell).startswith("B* not located (at or below")


def test_a_curve_that_never_saturates_gives_a_bound_not_a_point() -> None:
    table = np.array([[0.05 * j + off for j in range(len(BS))] for off in (0.0, 0.01, 0.02)])
    cell = estimate_b_star(N, BS, (0, 1, 2), table, TOL, rng=np.random.default_rng(0))
    assert cell.status == "above"
    assert cell.m_star is None
    assert cell.lower == BS[-2] and math.isinf(cell.upper)
    assert "still rises at the largest swept B = 1024" in cell.reason
    assert "B* not located (above" in b_text(cell)
    # ... unless the largest B is the whole training split: then it is bounded above too
    full = estimate_b_star(int(BS[-1]), BS, (0, 1, 2), table, TOL,
                           rng=np.random.default_rng(0))
    assert full.status == "above" and (full.lower, full.upper) == (BS[-2], BS[-1])


def test_missing_runs_are_left_out_not_read_as_zero() -> None:
    table = np.array([[planted(b) + off for b in BS] for off in (0.0, 0.01, -0.02)])
    table[1, 3] = np.nan  # one run of seed 1 never finished
    table[2, 6] = np.nan
    cell = estimate_b_star(N, BS, (0, 1, 2), table, TOL, rng=np.random.default_rng(0))
    assert cell.m_star == pytest.approx(planted_b_star(), rel=1e-5)
    # rows with an unreadable metric are the same as missing ones
    rows = [*rows_of(table), {"batch_size": 64, "seed": 1, "recall@1": float("nan")}]
    bs, seeds, again = batch_table(rows, "recall@1", True)
    assert bs == BS and seeds == (0, 1, 2)
    np.testing.assert_array_equal(np.isnan(again), np.isnan(table))


def test_a_lower_is_better_metric_is_oriented() -> None:
    table = np.array([[planted(b) + off for b in BS] for off in (0.0, 0.01)])
    rows = [{**r, "risk": -float(r["recall@1"])} for r in rows_of(table)]  # type: ignore[arg-type]
    up = b_star(rows_of(table), "recall@1", True, TOL, N)
    down = b_star(rows, "risk", False, TOL, N)
    assert up is not None and down is not None
    assert down.m_star == pytest.approx(up.m_star)


def test_the_tolerance_moves_b_star_the_expected_way() -> None:
    table = np.array([[planted(b) + off for b in BS] for off in (0.0, 0.01, -0.02)])
    sens = sensitivity(rows_of(table), metric_spec("recall@1"), TOL, N)
    assert [str(t) for t, _ in sens] == ["0.005", "0.01", "0.02"]
    stars = [c.m_star for _, c in sens]
    assert all(s is not None for s in stars)
    assert stars[0] > stars[1] > stars[2]  # type: ignore[operator]
    for (t, c) in sens:
        assert c.m_star == pytest.approx(planted_b_star(tol=t.value), rel=1e-5)
    relative = b_star(rows_of(table), "recall@1", True, Tolerance.parse("2%"), N)
    best = planted(256.0) + (0.0 + 0.01 - 0.02) / 3  # the seed-adjusted mean at the best B
    assert relative is not None and relative.tolerance_points == pytest.approx(0.02 * best)


def test_read_b_star_on_a_known_curve() -> None:
    curve = Saturating(0.5, 0.2, 0.6, 8.0)
    bs = BS[:6]
    r = read_b_star(curve, bs, top_of_grid=False, n=N, tolerance=TOL)
    assert r.status == "located"
    assert r.m_star == pytest.approx(planted_b_star())
    # at the top of the grid and still rising beyond it (extrapolated to the whole split)
    top = read_b_star(curve, bs, top_of_grid=True, n=N, tolerance=TOL)
    assert top.status == "above" and math.isinf(top.upper)


def test_the_refinement_goes_inside_the_widest_interval_with_every_seed() -> None:
    rng = np.random.default_rng(3)
    coarse = (8.0, 64.0, 512.0)
    table = np.array([[planted(b) + off + rng.normal(0, 0.01) for b in coarse]
                      for off in (0.0, 0.01, -0.01)])
    cell = estimate_b_star(N, coarse, (0, 1, 2), table, TOL, rng=np.random.default_rng(0))
    plan = plan_refinement([cell], budget=9)
    assert plan, "a wide cell gets new runs"
    assert {a.seed for a in plan} == {0, 1, 2}
    lo = cell.lower if cell.lower > 0 else 2.0
    hi = cell.upper if math.isfinite(cell.upper) else N
    assert all(lo <= a.m <= hi and a.m not in coarse for a in plan)
    assert len(plan) <= 9
