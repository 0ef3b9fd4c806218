"""Inner and outer error (docs/theory.md §5), rate fits and the InfoNCE MI bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from crl.errors import CrlValueError
from crl.losses import info_nce
from crl.theory import (
    CorrelatedGaussian,
    GaussianMeanShift,
    TabularModel,
    anchor_empirical_risk,
    fit_rate,
    inner_outer_error,
    mi_lower_bound,
    rotation_scorer,
    score_negatives,
)

M_VALUES = [8, 16, 32, 64, 128]


def _model_and_table() -> tuple[TabularModel, np.ndarray]:
    rng = np.random.default_rng(12)
    model = TabularModel([0.3, 0.7], rng.dirichlet(np.ones(6), size=2))
    # Mild scores (|s| ~ 0.5): the asymptotic rates show already at m = 8.
    return model, 0.5 * rng.normal(size=(2, 6))


def test_inner_error_rate_independent_negatives_is_one_over_m() -> None:
    model, table = _model_and_table()
    g = torch.Generator().manual_seed(0)
    runs = [inner_outer_error(model, table, 1.0, n=20_000, m=m, shared=False, repetitions=6,
                              generator=g) for m in M_VALUES]
    fit = fit_rate(M_VALUES, [r.inner_rms for r in runs])
    assert abs(fit.exponent - 1.0) < 0.15, fit
    # The inner error is the Jensen bias, positive, and matches the second-order term of
    # docs/theory.md §5.
    for r in runs:
        assert r.inner_mean > 0
        assert r.inner_rms == pytest.approx(r.inner_mean, rel=0.1)


def test_inner_error_rate_shared_negatives_is_one_over_sqrt_m() -> None:
    model, table = _model_and_table()
    g = torch.Generator().manual_seed(1)
    runs = [inner_outer_error(model, table, 1.0, n=800, m=m, shared=True, repetitions=80,
                              generator=g) for m in M_VALUES]
    fit = fit_rate(M_VALUES, [r.inner_rms for r in runs])
    assert abs(fit.exponent - 0.5) < 0.15, fit
    # The fluctuation dominates the bias: the RMS is several times the mean.
    assert all(r.inner_rms > 3 * abs(r.inner_mean) for r in runs)


def test_inner_bias_matches_second_order_formula() -> None:
    """``E[L_n - L_hat] ~ tau Var_{p-}(e^{s/tau}) / (2 m (E_{p-} e^{s/tau})^2)``
    (docs/theory.md §5)."""
    model, table = _model_and_table()
    tau, m = 1.0, 64
    w = np.exp(table / tau)  # (X, Y)
    mean = (model.p_neg_matrix * w).sum(1)
    var = (model.p_neg_matrix * w**2).sum(1) - mean**2
    predicted = float(model.p_x @ (tau * var / (2 * m * mean**2)))
    r = inner_outer_error(model, table, tau, n=20_000, m=m, shared=False, repetitions=6,
                          generator=torch.Generator().manual_seed(2))
    # Within 4 standard errors, plus 5% for the O(1/m^2) terms the formula leaves out.
    assert abs(r.inner_mean - predicted) < 4 * r.inner_stderr + 0.05 * predicted, (r, predicted)
    # A formula off by a factor 2 (e.g. a missing 1/2) is far outside that.
    assert abs(r.inner_mean - 2 * predicted) > 4 * r.inner_stderr + 0.05 * predicted


def test_outer_error_and_decomposition() -> None:
    model = GaussianMeanShift(0.8, 1.0)
    scorer = rotation_scorer(0.6, 0.4)
    tau = 1.0
    g = torch.Generator().manual_seed(3)
    r = inner_outer_error(model, scorer, tau, n=400, m=32, shared=False, repetitions=200,
                          generator=g)
    assert r.population_risk == model.risk(scorer, tau)
    # inner + outer = L - L_hat on every repetition, hence on average.
    assert r.inner_mean + r.outer_mean == pytest.approx(r.expected_gap, abs=1e-12)
    # Outer error: mean 0, RMS = sd(anchor risk) / sqrt(n).
    x, y = model.sample(200_000, g)
    sd = float(model.anchor_risk(scorer, x, y, tau).std())
    assert abs(r.outer_mean) < 4 * sd / math.sqrt(400) / math.sqrt(200)
    assert r.outer_rms == pytest.approx(sd / math.sqrt(400), rel=0.15)
    assert r.to_dict()["shared"] is False


def test_anchor_empirical_risk_and_score_negatives_against_loops() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 3, generator=g, dtype=torch.float64)
    y = torch.randn(5, 3, generator=g, dtype=torch.float64)
    shared = torch.randn(4, 3, generator=g, dtype=torch.float64)
    independent = torch.randn(5, 4, 3, generator=g, dtype=torch.float64)
    dot = lambda a, b: (a * b).sum(-1)  # noqa: E731
    s_shared = score_negatives(dot, x, shared, shared=True)
    s_indep = score_negatives(dot, x, independent, shared=False)
    tau = 0.3
    for i in range(5):
        for j in range(4):
            assert float(s_shared[i, j]) == pytest.approx(float(x[i] @ shared[j]))
            assert float(s_indep[i, j]) == pytest.approx(float(x[i] @ independent[i, j]))
        pos = float(x[i] @ y[i])
        ref = tau * math.log(sum(math.exp((float(s_indep[i, j]) - pos) / tau)
                                 for j in range(4)) / 4)
        assert float(anchor_empirical_risk(dot(x, y), s_indep, tau)[i]) == pytest.approx(ref)


def test_fit_rate_exact_and_interval() -> None:
    m = np.array([4.0, 8, 16, 32, 64])
    fit = fit_rate(m, 3.0 * m**-0.7)
    assert fit.exponent == pytest.approx(0.7) and fit.constant == pytest.approx(3.0)
    noisy = 3.0 * m**-0.7 * np.exp(np.random.default_rng(0).normal(0, 0.05, m.size))
    fit = fit_rate(m, noisy)
    assert fit.low < 0.7 < fit.high and fit.high - fit.low < 0.5
    with pytest.raises(CrlValueError, match="> 0"):
        fit_rate([1, 2, 3], [1.0, 0.0, 1.0])
    with pytest.raises(CrlValueError, match="length"):
        fit_rate([1, 2], [1.0, 0.5])


def test_mi_lower_bound_holds_for_infonce_on_correlated_gaussian() -> None:
    rho, dim, k = 0.8, 2, 64
    model = CorrelatedGaussian(rho, dim)
    mutual_information = -0.5 * dim * math.log(1 - rho**2)
    g = torch.Generator().manual_seed(5)
    bounds = []
    for _ in range(20):
        x, y = model.sample(k, g)
        # InfoNCE with the optimal critic log p(y|x)/p(y): logits[i, j] = s*(x_i, y_j).
        logits = model.log_density_ratio(x.repeat_interleave(k, 0), y.repeat(k, 1)).reshape(k, k)
        # info_nce works on embeddings: a one-hot "anchor" times the logits rows gives them back.
        loss = float(info_nce(torch.eye(k, dtype=torch.float64), logits.T, temperature=1.0))
        bounds.append(mi_lower_bound(loss, k))
    mean_bound = float(np.mean(bounds))
    assert mean_bound <= mutual_information + 4 * float(np.std(bounds)) / math.sqrt(20)
    assert mean_bound > 0.5 * mutual_information  # with the optimal critic the bound is close
    assert mi_lower_bound(0.0, 1) == 0.0
    with pytest.raises(CrlValueError):
        mi_lower_bound(float("nan"), 4)
