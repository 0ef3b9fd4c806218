"""``fit_critical_m`` on synthetic sweeps whose alpha, beta and m* are known."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crl.errors import CrlTypeError, CrlValueError
from crl.theory import fit_critical_m

DELTA = 0.01
N_VALUES = [1_000, 4_000, 16_000, 64_000]
M_VALUES = [2**k for k in range(0, 17)]
TRUTH = {"shared": {"alpha": 0.9, "beta": 0.5, "c": 0.3},
         "independent": {"alpha": 0.5, "beta": 1.0, "c": 2.0}}


def synthetic_rows(noise: float, seed: int = 0, seeds: int = 2) -> list[dict[str, object]]:
    """err(m) = E_inf(n) + A(n) m^-beta + noise, with A chosen so that m*(n) = c n^alpha."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    for regime, t in TRUTH.items():
        for n in N_VALUES:
            m_star = t["c"] * n ** t["alpha"]
            amplitude = DELTA * m_star ** t["beta"]
            e_inf = 0.2 + 0.5 / math.sqrt(n)
            for s in range(seeds):
                for m in M_VALUES:
                    err = e_inf + amplitude * m ** -t["beta"] + rng.normal(0, noise)
                    rows.append({"n": n, "m": m, "regime": regime, "seed": s, "metric": err})
    return rows


def test_recovers_alpha_beta_and_m_star_from_noisy_tables() -> None:
    res = fit_critical_m(synthetic_rows(noise=0.002), DELTA, num_bootstrap=200)
    assert len(res.fits) == 2 * len(N_VALUES)
    for regime, t in TRUTH.items():
        scaling = res.regimes[regime]
        assert scaling.reason == ""
        assert abs(scaling.alpha - t["alpha"]) < 0.1, scaling
        lo, hi = scaling.alpha_ci
        assert lo < scaling.alpha < hi and hi - lo < 0.5
        for n in N_VALUES:
            fit = res.fit(regime, n)
            assert fit.reason == "", fit
            assert abs(fit.beta - t["beta"]) < 0.1, fit
            assert fit.beta_ci[0] < fit.beta < fit.beta_ci[1]
            assert fit.amplitude_ci[0] < fit.amplitude < fit.amplitude_ci[1]
            true_m = t["c"] * n ** t["alpha"]
            assert abs(math.log(fit.m_star / true_m)) < math.log(1.5), (fit.m_star, true_m)
            assert fit.m_star_ci[0] < fit.m_star < fit.m_star_ci[1]
            assert fit.m_star_over_n == pytest.approx(fit.m_star / n)
            assert fit.preferred == "power"
            assert fit.e_inf == pytest.approx(0.2 + 0.5 / math.sqrt(n), abs=0.01)


def test_bootstrap_intervals_cover_the_truth() -> None:
    """95% intervals: over 10 noisy tables, alpha is covered in >= 16 of 20 (regime, table)
    pairs and m* in >= 80% of the 80 per-n fits (measured: 19/20 and 93% over 20 tables)."""
    alpha_hits = m_hits = total_m = 0
    for seed in range(10):
        res = fit_critical_m(synthetic_rows(noise=0.002, seed=seed), DELTA, num_bootstrap=100,
                             seed=seed)
        for regime, t in TRUTH.items():
            lo, hi = res.regimes[regime].alpha_ci
            alpha_hits += lo <= t["alpha"] <= hi
            for n in N_VALUES:
                fit = res.fit(regime, n)
                total_m += 1
                m_hits += fit.m_star_ci[0] <= t["c"] * n ** t["alpha"] <= fit.m_star_ci[1]
    assert alpha_hits >= 16
    assert m_hits >= 0.8 * total_m


def test_exact_power_laws_give_exact_answers() -> None:
    res = fit_critical_m(synthetic_rows(noise=0.0, seeds=1), DELTA, num_bootstrap=20)
    for regime, t in TRUTH.items():
        assert res.regimes[regime].alpha == pytest.approx(t["alpha"], abs=1e-3)
        assert res.regimes[regime].intercept == pytest.approx(math.log(t["c"]), abs=1e-2)


def test_table_formats_agree_and_score_metrics_convert() -> None:
    rows = synthetic_rows(noise=0.002, seeds=1)
    columns = {k: [r[k] for r in rows] for k in rows[0]}
    structured = np.array([(r["n"], r["m"], r["regime"], r["seed"], r["metric"]) for r in rows],
                          dtype=[("n", "i8"), ("m", "i8"), ("regime", "U16"), ("seed", "i8"),
                                 ("metric", "f8")])
    a = fit_critical_m(rows, DELTA, num_bootstrap=50).to_dict()
    b = fit_critical_m(columns, DELTA, num_bootstrap=50).to_dict()
    c = fit_critical_m(structured, DELTA, num_bootstrap=50).to_dict()
    assert a == b == c
    recall = [{**r, "recall": 1.0 - float(r["metric"])} for r in rows]  # type: ignore[arg-type]
    d = fit_critical_m(recall, DELTA, metric="recall", higher_is_better=True, num_bootstrap=50)
    for fit_a, fit_d in zip(a["fits"], d.fits, strict=True):
        assert fit_d.m_star == pytest.approx(fit_a["m_star"], rel=1e-9)
    json.dumps(a, allow_nan=False)


def test_unidentifiable_sweeps_are_reported_not_raised() -> None:
    rng = np.random.default_rng(1)
    rows = []
    for m in [1, 4, 16, 64, 256]:
        rows.append({"n": 100, "m": m, "regime": "flat", "seed": 0,
                     "metric": 0.3 + rng.normal(0, 1e-3)})
        rows.append({"n": 100, "m": m, "regime": "worse", "seed": 0, "metric": 0.3 + 0.01 * m})
    rows += [{"n": 200, "m": m, "regime": "flat", "seed": 0, "metric": 0.5 / m} for m in (1, 2)]
    rows.append({"n": 100, "m": 8, "regime": "flat", "seed": 1, "metric": float("nan")})
    rows.append({"n": 100, "m": None, "regime": "flat", "seed": 1, "metric": 0.3})
    res = fit_critical_m(rows, 0.01, num_bootstrap=50)
    assert res.dropped_rows == 2 and res.notes
    worse = res.fit("worse", 100)
    assert math.isnan(worse.m_star) and "no improvement" in worse.reason
    two_m = res.fit("flat", 200)
    assert math.isnan(two_m.m_star) and "3 distinct m" in two_m.reason
    assert math.isnan(res.regimes["worse"].alpha) and res.regimes["worse"].reason
    flat = res.fit("flat", 100)
    assert math.isnan(flat.m_star) == bool(flat.reason)
    out = res.to_dict()
    json.dumps(out, allow_nan=False)
    assert out["fits"][0]["m_star"] is None or isinstance(out["fits"][0]["m_star"], float)


def test_aic_prefers_the_true_family() -> None:
    m = np.array([2.0**k for k in range(0, 12)])
    rng = np.random.default_rng(3)
    exp_rows = [{"n": 1000, "m": float(v), "metric": 0.2 + 0.3 * math.exp(-v / 40)
                 + rng.normal(0, 1e-3)} for v in m]
    res = fit_critical_m(exp_rows, 0.01, num_bootstrap=20)
    fit = res.fit("all", 1000)
    assert fit.preferred == "exponential" and fit.aic_exponential < fit.aic_power
    assert fit.exponential_m0 == pytest.approx(40, rel=0.1)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([10, 100, 1000, -5]),
                          st.sampled_from([0, 1, 2, 4, 8, 1e6, float("nan")]),
                          st.sampled_from(["a", "b"]),
                          st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                    st.none())),
                min_size=0, max_size=40),
       st.floats(1e-6, 10.0))
def test_never_crashes_on_ragged_noisy_tables(rows: list[tuple[object, ...]],
                                              tolerance: float) -> None:
    table = [{"n": n, "m": m, "regime": r, "metric": v} for n, m, r, v in rows]
    res = fit_critical_m(table, tolerance, num_bootstrap=20)
    json.dumps(res.to_dict(), allow_nan=False)
    for fit in res.fits:
        assert math.isfinite(fit.m_star) or fit.reason


def test_bad_input() -> None:
    with pytest.raises(CrlValueError, match="lacks column"):
        fit_critical_m([{"n": 1, "m": 1}], 0.1)
    with pytest.raises(CrlValueError, match="tolerance"):
        fit_critical_m([{"n": 1, "m": 1, "metric": 0.1}], 0.0)
    with pytest.raises(CrlValueError, match="same length"):
        fit_critical_m({"n": [1, 2], "m": [1], "metric": [0.1, 0.2]}, 0.1)
    with pytest.raises(CrlTypeError, match="results"):
        fit_critical_m("results.csv", 0.1)
