"""The law m*(n) tested before it is used (crl.experiments.negatives.laws): planted answers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from crl.experiments.negatives.answer import answer, answer_from_cells, tolerance_sensitivity
from crl.experiments.negatives.backtest import backtest
from crl.experiments.negatives.curves import curve_cells
from crl.experiments.negatives.laws import (
    Observation,
    _arrays,
    _lik_grad,
    _log_lik_grad,
    _newton,
    _objective,
    fit_law,
    log_likelihood,
    recommend,
)
from crl.experiments.negatives.tolerance import Tolerance
from negatives_planted import cell, law_rows, planted_table

NS = [500, 1000, 2000, 4000, 8000, 16000]


def _law_cells(alpha: float, c: float, *, jitter: float = 0.0, seed: int = 0,
               width: float = 1.3, breaks: dict[int, float] | None = None) -> list:
    """Cells on ``e^c n^alpha`` (times ``breaks``), each m* off by ``jitter`` in log, with a
    95% interval of ratio ``width``."""
    rng = np.random.default_rng(seed)
    out = []
    for n in NS:
        m = math.exp(c + alpha * math.log(n) + rng.normal(0, jitter)) * (breaks or {}).get(n, 1)
        out.append(cell(n, m, m / math.sqrt(width), m * math.sqrt(width)))
    return out


def test_planted_law_from_noisy_curves_is_recovered_within_its_intervals() -> None:
    rows = law_rows(NS, 0.5, 0.3, seeds=4, noise=0.002)
    result = answer(rows, "score", True, Tolerance(0.01), 40_000)
    law = result.laws["independent"]
    assert law.verdict == "fits" and law.alpha is not None and law.alpha_ci is not None
    assert law.alpha_ci[0] <= 0.5 <= law.alpha_ci[1]
    assert law.alpha_ci[1] - law.alpha_ci[0] < 0.5
    rec = result.recommendations["independent"]
    truth = math.exp(0.3) * 40_000 ** 0.5
    assert rec.source == "law" and rec.extrapolation and rec.m is not None
    assert rec.low <= truth <= rec.high
    assert result.verdicts["independent"].verdict == "consistent"
    test = result.backtests["independent"]
    assert test.agrees and test.predicted is not None


def test_a_cell_that_breaks_the_law_is_flagged_and_the_fallback_is_measured() -> None:
    cells = _law_cells(1.0, -2.0, breaks={4000: 5.0})
    law = fit_law(cells, "independent")
    assert law.verdict == "does not fit" and law.p_value is not None and law.p_value < 0.05
    assert "one power law does not describe these cells" in law.reason
    worst = max(law.residuals, key=lambda r: abs(r[1]))
    assert worst[0] == 4000
    rec = recommend(law, cells, 12_000)
    nearest = next(c for c in cells if c.n == 16000)  # |log(16000/12000)| < |log(8000/12000)|
    assert rec.source == "nearest cell" and rec.n_used == 16000 and not rec.extrapolation
    assert (rec.m, rec.low, rec.high) == (nearest.m_star, nearest.lower, nearest.upper)


def test_scatter_across_cells_widens_the_interval() -> None:
    tight = fit_law(_law_cells(0.5, 0.0, jitter=0.0), "independent")
    loose = fit_law(_law_cells(0.5, 0.0, jitter=0.5, seed=1, width=1.05), "independent")
    assert tight.alpha_ci is not None and loose.alpha_ci is not None and loose.tau is not None
    assert loose.tau > 0.2
    assert (loose.alpha_ci[1] - loose.alpha_ci[0]) > 2 * (tight.alpha_ci[1] - tight.alpha_ci[0])


def test_censored_cells_enter_as_bounds_and_the_fit_without_them_is_reported() -> None:
    cells = _law_cells(0.5, 0.0)[:4]
    # An unsaturated cell at n = 16000 whose bound sits far above the line pulls alpha up.
    bound = 4 * math.exp(0.5 * math.log(16000))
    cells.append(cell(16000, None, bound, math.inf, status="above"))
    with_bound = fit_law(cells, "independent")
    without = fit_law(cells, "independent", with_censored=False)
    assert len(with_bound.observations) == 5 and len(without.observations) == 4
    assert without.alpha == pytest.approx(0.5, abs=1e-3)
    assert with_bound.alpha is not None and with_bound.alpha > 0.6
    # A bound the line already satisfies changes nothing.
    easy = [*cells[:4], cell(16000, None, 10.0, math.inf, status="above")]
    assert fit_law(easy, "independent").alpha == pytest.approx(0.5, abs=1e-3)


def test_a_censored_nearest_cell_gives_bounds_not_a_point() -> None:
    cells = _law_cells(1.0, -2.0, breaks={4000: 5.0})[:-1]
    cells.append(cell(16000, None, 9000, 16000, status="above"))
    rec = recommend(fit_law(cells, "independent"), cells, 20_000)
    assert rec.source == "nearest cell" and rec.m is None and (rec.low, rec.high) == (9000, 16000)
    assert "only bounds m*" in rec.reason


def test_two_cells_are_untested_and_never_extrapolated() -> None:
    cells = _law_cells(0.5, 0.0)[:2]
    law = fit_law(cells, "independent")
    assert law.verdict == "untested" and law.p_value is None
    assert recommend(law, cells, 100_000).source == "nearest cell"
    one = fit_law(cells[:1], "independent")
    assert one.alpha is None and "need 2" in one.reason


def test_backtest_flags_a_largest_cell_off_the_law() -> None:
    cells = _law_cells(0.5, 0.0, breaks={16000: 8.0})
    test = backtest(cells, "independent")
    assert test is not None and test.held_out_n == 16000 and test.predicted is not None
    assert test.agrees is False
    good = backtest(_law_cells(0.5, 0.0), "independent")
    assert good is not None and good.agrees is True


def test_three_cells_backtest_from_two_gives_an_open_prediction() -> None:
    # three swept n (the transformer quick grid's): the backtest fits two cells, whose line
    # leaves no degree of freedom for its interval; it must say so, not fail on a NaN bound
    cells = _law_cells(0.5, 0.0)[:3]
    law = fit_law(cells[:2], "independent")
    point, low, high = law.predict(cells[2].n) or (math.nan, math.nan, math.nan)
    assert math.isfinite(point) and (low, high) == (0.0, math.inf)
    test = backtest(cells, "independent")
    assert test is not None and test.agrees is None and "not bounded" in test.reason


def test_likelihood_gradient_matches_finite_differences() -> None:
    obs = [Observation(100, True, 2.0, 0.1, 2.0, 2.0), Observation(400, True, 3.1, 0.2, 3.1, 3.1),
           Observation(1600, False, math.nan, 0.1, 3.5, math.inf),
           Observation(3000, False, math.nan, 0.1, -math.inf, 4.0),
           Observation(6000, False, math.nan, 0.1, 3.0, 4.5)]
    v = np.array([0.7, -1.0, 0.3])
    grad = _log_lik_grad(obs, *v)[1:]
    for k in range(3):
        step = np.eye(3)[k] * 1e-6
        numeric = (log_likelihood(obs, *(v + step)) - log_likelihood(obs, *(v - step))) / 2e-6
        assert grad[k] == pytest.approx(numeric, rel=1e-5)


_MIXED = [Observation(100, True, 2.0, 0.1, 2.0, 2.0), Observation(400, True, 3.1, 0.2, 3.1, 3.1),
          Observation(1600, False, math.nan, 0.1, 3.5, math.inf),
          Observation(3000, False, math.nan, 0.1, -math.inf, 4.0),
          Observation(6000, False, math.nan, 0.1, 3.0, 4.5)]


@pytest.mark.parametrize(("names", "fixed", "v"), [
    (["alpha", "c", "w"], {}, [0.7, -1.0, 0.09]),
    (["c", "w"], {"alpha": 0.4}, [0.5, 0.3]),
    (["alpha", "w"], {"y_at": 4.0, "x_at": math.log(8000)}, [0.5, 0.02]),
    (["alpha", "c"], {"tau": 0.0}, [0.6, 0.1]),
])
def test_objective_gradient_and_hessian_match_finite_differences(
        names: list[str], fixed: dict[str, float], v: list[float]) -> None:
    # Newton's analytic derivatives, located and censored cells (open and closed bounds),
    # against central differences of the value and of the gradient
    arrays, point, h = _arrays(_MIXED), np.array(v), 1e-6
    value, grad, hess = _objective(names, fixed, arrays, point)
    p = dict(zip(names, v, strict=True))
    alpha = p.get("alpha", fixed.get("alpha"))
    c = fixed["y_at"] - alpha * fixed["x_at"] if "y_at" in fixed else p["c"]
    assert value == pytest.approx(_lik_grad(arrays, alpha, c, math.sqrt(p.get("w", 0.0)))[0])
    for k in range(len(v)):
        step = np.eye(len(v))[k] * h
        up, down = (_objective(names, fixed, arrays, point + s) for s in (step, -step))
        assert grad[k] == pytest.approx((up[0] - down[0]) / (2 * h), rel=1e-5, abs=1e-6)
        np.testing.assert_allclose(hess[:, k], (up[1] - down[1]) / (2 * h), rtol=1e-4,
                                   atol=1e-4)
    np.testing.assert_allclose(hess, hess.T)


def test_newton_reaches_the_maximum_bfgs_finds() -> None:
    # the same optimum as scipy's BFGS on the same likelihood (to its gtol), in the interior
    # and with the scatter on its bound tau = 0 (cells exactly on a line)
    from scipy import optimize

    on_line = [Observation(n, True, 0.5 * math.log(n), 0.1, 0.5 * math.log(n),
                           0.5 * math.log(n)) for n in (100, 400, 1600, 6400)]
    for obs in (_MIXED, on_line):
        arrays = _arrays(obs)
        found = _newton(["alpha", "c", "w"], {}, arrays, np.array([0.5, 0.0, 0.25]))
        assert found is not None
        top, v = found

        def nll(u: np.ndarray, arrays: tuple[np.ndarray, ...] = arrays) -> float:
            return -_lik_grad(arrays, u[0], u[1], u[2] ** 2)[0]

        ref = optimize.minimize(nll, np.array([0.5, 0.0, 0.5]), method="BFGS",
                                options={"gtol": 1e-8})
        assert top >= -ref.fun - 1e-9
        assert v[:2] == pytest.approx(ref.x[:2], abs=1e-4)
        assert math.sqrt(v[2]) == pytest.approx(ref.x[2] ** 2, abs=1e-4)
    assert v[2] == 0.0  # on the line: no scatter left, exactly


def test_a_fit_newton_does_not_finish_falls_back_to_bfgs(monkeypatch: pytest.MonkeyPatch) -> None:
    # with no Newton iterations allowed every maximisation is BFGS's: the same law to its gtol
    from crl.experiments.negatives import laws

    cells = _law_cells(0.5, 0.2, jitter=0.2, seed=3)
    newton = fit_law(cells, "independent")
    laws._maximised.cache_clear()
    monkeypatch.setattr(laws, "NEWTON_MAX_ITER", 0)
    calls = []
    minimize = laws.optimize.minimize

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return minimize(*args, **kwargs)

    monkeypatch.setattr(laws.optimize, "minimize", counted)
    try:
        bfgs = fit_law(cells, "independent")
    finally:
        laws._maximised.cache_clear()
    assert newton.alpha is not None and bfgs.alpha is not None
    assert bfgs.alpha == pytest.approx(newton.alpha, abs=1e-5)
    assert bfgs.log_lik == pytest.approx(newton.log_lik, abs=1e-8)
    assert bfgs.verdict == newton.verdict and bfgs.p_value == pytest.approx(newton.p_value)
    assert calls  # BFGS did the fits


def test_tolerance_sensitivity_reports_half_chosen_and_twice() -> None:
    rows = law_rows(NS[:4], 0.5, 0.3, seeds=3, noise=0.001)
    results = tolerance_sensitivity(rows, "score", True, Tolerance(0.01), 10_000)
    assert [r.tolerance.value for r in results] == [0.005, 0.01, 0.02]
    for a, b in itertools.pairwise(results):
        for ca, cb in zip(a.cells, b.cells, strict=True):
            if ca.m_star is not None and cb.m_star is not None:
                assert cb.m_star < ca.m_star  # a larger tolerance stops sooner
    assert all("independent" in r.recommendations for r in results)


def test_curve_cells_are_deterministic() -> None:
    rows = law_rows(NS[:3], 0.5, 0.3, seeds=3, noise=0.002)
    a = curve_cells(rows, "score", True, Tolerance(0.01))
    b = curve_cells(list(reversed(rows)), "score", True, Tolerance(0.01))
    assert [(c.m_star, c.lower, c.upper) for c in a] == [(c.m_star, c.lower, c.upper) for c in b]


def _target_rows(target: int, m_star: float, *, seeds: int = 4, seed: int = 1,
                 regime: str = "independent") -> list[dict[str, object]]:
    """Verify-stage rows at ``target`` whose curve saturates at ``m_star``."""
    ms = [round(target * f) for f in (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 1.0)]
    table = planted_table(ms, m_star, seeds=seeds, noise=0.001,
                          rng=np.random.default_rng(seed))
    return [{"regime": regime, "n": target, "m": m, "seed": s, "arm": "verify",
             "score": float(table[s, j])} for s in range(seeds) for j, m in enumerate(ms)]


def test_a_measurement_at_the_target_replaces_the_prediction_and_tests_it() -> None:
    """Planted: the grid's law predicts e^0.3 n^0.5 (about 270 at n = 40,000); at the target
    the truth is 2,000. The recommendation is the measured m* with its own seed interval
    (holding 2,000), the law's prediction is kept beside it and flagged as missing; at half
    and twice the tolerance the target cell is re-read, m* moving the right way."""
    rows = law_rows(NS, 0.5, 0.3, seeds=4, noise=0.002)
    target_rows = _target_rows(40_000, 2_000.0)
    answers = tolerance_sensitivity(rows, "score", True, Tolerance(0.01), 40_000,
                                    target_rows=target_rows)
    result = answers[1]
    rec = result.recommendations["independent"]
    assert rec.source == "verify stage" and rec.n_used == 40_000 and not rec.extrapolation
    assert rec.m is not None and rec.low <= 2_000 <= rec.high and rec.high / rec.low < 2
    assert rec.prediction is not None and rec.prediction.source == "law"
    assert rec.prediction.high < 2_000 and rec.prediction_inside is False
    [target] = result.targets
    assert target.n == 40_000 and target.m_star == rec.m and target.exact
    assert all(c.n != 40_000 for c in result.cells)  # the target never enters the law
    assert result.laws == answer(rows, "score", True, Tolerance(0.01), 40_000).laws
    half, _, twice = (a.recommendations["independent"].m for a in answers)
    assert half is not None and twice is not None and half > rec.m > twice
    assert result.to_dict()["recommendations"]["independent"]["prediction"]["source"] == "law"
    # a measurement inside the law's interval is flagged as such
    agreeing = answer(rows, "score", True, Tolerance(0.01), 40_000,
                      target_rows=_target_rows(40_000, math.exp(0.3) * 40_000 ** 0.5))
    assert agreeing.recommendations["independent"].prediction_inside is True


def test_target_cells_must_be_at_the_target_n() -> None:
    rows = law_rows(NS, 0.5, 0.3, seeds=3, noise=0.002)
    cells = curve_cells(rows, "score", True, Tolerance(0.01))
    with pytest.raises(ValueError, match="target cells must be at n = 40000"):
        answer_from_cells(cells, Tolerance(0.01), 40_000, targets=cells[:1])
