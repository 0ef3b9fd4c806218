"""Exact answers of the theory models against formulas written out here and against Monte Carlo."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crl.errors import CrlTypeError, CrlValueError
from crl.theory import (
    BilinearScorer,
    CorrelatedGaussian,
    GaussianMeanShift,
    LatentClassModel,
    TableScorer,
    TabularModel,
    mc_auc,
    mc_risk,
    rotation_scorer,
)

# Monte Carlo sizes: the standard errors they give (about 0.005 for AUCs, 0.01 for risks) are
# far below the size of the mistakes the tests guard against (a wrong constant or sign).
ANCHORS = 6_000
NEGATIVES = 200


def random_tabular(seed: int, shared_negatives: bool = True) -> TabularModel:
    rng = np.random.default_rng(seed)
    nx, ny = int(rng.integers(1, 5)), int(rng.integers(2, 7))
    p_x = rng.dirichlet(np.ones(nx))
    p_pos = rng.dirichlet(np.full(ny, 0.7), size=nx)
    p_neg = rng.dirichlet(np.ones(ny)) if shared_negatives else rng.dirichlet(np.ones(ny), nx)
    return TabularModel(p_x, p_pos, p_neg)


# ---------------------------------------------------------------- slow references (loops)

def reference_risk(model: TabularModel, table: np.ndarray, tau: float) -> float:
    total = 0.0
    for x in range(model.num_anchors):
        inner = sum(model.p_neg_matrix[x, y] * math.exp(table[x, y] / tau)
                    for y in range(model.num_candidates))
        for y in range(model.num_candidates):
            total += model.p_x[x] * model.p_pos[x, y] * (tau * math.log(inner) - table[x, y])
    return total


def reference_auc(model: TabularModel, table: np.ndarray) -> float:
    total = 0.0
    for x in range(model.num_anchors):
        for y, yn in itertools.product(range(model.num_candidates), repeat=2):
            win = 1.0 if table[x, y] > table[x, yn] else 0.5 if table[x, y] == table[x, yn] else 0
            total += model.p_x[x] * model.p_pos[x, y] * model.p_neg_matrix[x, yn] * win
    return total


def reference_tilted_kl(model: TabularModel, table: np.ndarray, tau: float) -> float:
    """E_x KL(p+_x || q_x), q_x(y) = p-_x(y) e^{s/tau} / Z_x, straight from docs/theory.md §1."""
    total = 0.0
    for x in range(model.num_anchors):
        weights = [model.p_neg_matrix[x, y] * math.exp(table[x, y] / tau)
                   for y in range(model.num_candidates)]
        z = sum(weights)
        for y in range(model.num_candidates):
            p = model.p_pos[x, y]
            if p > 0:
                total += model.p_x[x] * p * math.log(p / (weights[y] / z))
    return total


# ---------------------------------------------------------------- tabular


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), tau=st.floats(0.05, 5.0), scale=st.floats(0.01, 4.0),
       shared=st.booleans())
def test_excess_risk_is_tau_times_tilted_kl(seed: int, tau: float, scale: float,
                                            shared: bool) -> None:
    model = random_tabular(seed, shared)
    table = np.random.default_rng(seed + 1).normal(size=model.p_pos.shape) * scale
    excess = model.risk(table, tau) - model.optimal_risk(tau)
    assert excess == pytest.approx(tau * reference_tilted_kl(model, table, tau), abs=1e-10)
    assert excess == pytest.approx(tau * float(model.p_x @ model.tilted_kl(table, tau)), abs=1e-10)
    assert excess >= -1e-12


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), tau=st.floats(0.1, 3.0))
def test_tabular_risk_and_auc_match_loops(seed: int, tau: float) -> None:
    model = random_tabular(seed, shared_negatives=seed % 2 == 0)
    # Round so that ties occur and the 1/2 rule is exercised.
    table = np.round(np.random.default_rng(seed).normal(size=model.p_pos.shape), 0)
    assert model.risk(table, tau) == pytest.approx(reference_risk(model, table, tau), abs=1e-12)
    assert model.auc(table) == pytest.approx(reference_auc(model, table), abs=1e-12)
    s_star = model.optimal_table(tau)
    assert model.risk(s_star, tau) == pytest.approx(model.optimal_risk(tau), abs=1e-12)
    assert model.auc(s_star) == pytest.approx(reference_auc(model, s_star), abs=1e-12)
    # The table, a TableScorer and a callable are the same scorer.
    scorer = TableScorer(table)
    assert model.auc(scorer) == model.auc(table)
    assert model.risk(lambda x, y: scorer(x, y), tau) == pytest.approx(model.risk(table, tau))


def test_optimal_score_is_risk_minimiser_and_auc_maximiser_among_perturbations() -> None:
    model = random_tabular(3)
    tau = 0.7
    s_star = model.optimal_table(tau)
    rng = np.random.default_rng(0)
    for _ in range(200):
        other = s_star + rng.normal(size=s_star.shape) * rng.uniform(0.001, 1.0)
        assert model.risk(other, tau) >= model.optimal_risk(tau) - 1e-12
        assert model.auc(other) <= model.optimal_auc() + 1e-12
    # g(x) shifts change nothing.
    shifted = s_star + rng.normal(size=(model.num_anchors, 1))
    assert model.risk(shifted, tau) == pytest.approx(model.optimal_risk(tau), abs=1e-12)


def test_tabular_sampling_frequencies() -> None:
    model = TabularModel([0.2, 0.8], [[0.5, 0.5, 0.0], [0.1, 0.2, 0.7]], [0.3, 0.3, 0.4])
    g = torch.Generator().manual_seed(0)
    x, y = model.sample(40_000, g)
    assert x.shape == y.shape == (40_000,) and x.dtype == torch.int64
    counts = np.zeros((2, 3))
    np.add.at(counts, (x.numpy(), y.numpy()), 1)
    assert np.allclose(counts / counts.sum(), model.p_x[:, None] * model.p_pos, atol=0.01)
    neg = model.sample_negatives(x[:1000], 30, g)
    assert neg.shape == (1000, 30)
    assert np.allclose(np.bincount(neg.flatten().numpy(), minlength=3) / neg.numel(),
                       [0.3, 0.3, 0.4], atol=0.01)
    assert model.sample_negatives(x, 7, g, shared=True).shape == (7,)


def test_anchor_dependent_negatives() -> None:
    model = TabularModel([0.5, 0.5], [[0.0, 1.0], [1.0, 0.0]], [[0.0, 1.0], [1.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    x = torch.tensor([0, 1, 0])
    neg = model.sample_negatives(x, 5, g)
    assert neg[0].tolist() == [1] * 5 and neg[1].tolist() == [0] * 5
    with pytest.raises(CrlValueError, match="shared negatives"):
        model.sample_negatives(x, 5, g, shared=True)


def test_tabular_bad_input() -> None:
    with pytest.raises(CrlValueError, match="sum to 1"):
        TabularModel([0.5, 0.6], [[1.0], [1.0]])
    with pytest.raises(CrlValueError, match="p_neg` must be > 0"):
        TabularModel([1.0], [[0.5, 0.5]], [1.0, 0.0])
    with pytest.raises(CrlValueError, match="shape"):
        TabularModel([1.0], [[0.5, 0.5]], [0.2, 0.3, 0.5])
    model = TabularModel([1.0], [[0.5, 0.5]])
    with pytest.raises(CrlValueError, match="shape"):
        model.risk(np.zeros((2, 2)), 1.0)
    with pytest.raises(CrlValueError, match="NaN"):
        model.auc(np.array([[np.nan, 0.0]]))
    with pytest.raises(CrlValueError, match="tau"):
        model.risk(np.zeros((1, 2)), 0.0)
    with pytest.raises(CrlTypeError, match="scorer"):
        model.risk("table", 1.0)


# ---------------------------------------------------------------- latent classes


@pytest.mark.parametrize("class_probs", [[0.5, 0.5], [0.7, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]])
def test_latent_class_closed_forms(class_probs: list[float]) -> None:
    tau = 0.5
    within = np.random.default_rng(1).dirichlet(np.ones(3), size=len(class_probs))
    model = LatentClassModel(class_probs, items_per_class=3, within_class=within)
    pi = np.array(class_probs)
    l_star = -tau * -np.sum(pi * np.log(pi))  # -tau H(pi)
    e_star = 1 - 0.5 * np.sum(pi**2)
    assert model.optimal_risk(tau) == pytest.approx(l_star, abs=1e-12)
    assert model.optimal_auc() == pytest.approx(e_star, abs=1e-12)
    # The enumeration of the tabular parent agrees with the closed forms.
    assert TabularModel.optimal_risk(model, tau) == pytest.approx(l_star, abs=1e-12)
    assert TabularModel.optimal_auc(model) == pytest.approx(e_star, abs=1e-12)
    # Monte Carlo of s* = tau log(p+/p-) agrees within 4 standard errors.
    g = torch.Generator().manual_seed(7)
    scorer = model.optimal_scorer(tau)
    risk = mc_risk(model, scorer, tau, num_anchors=ANCHORS, num_negatives=NEGATIVES, generator=g)
    auc = mc_auc(model, scorer, num_anchors=ANCHORS, num_negatives=16, generator=g)
    assert risk.contains(l_star) and risk.stderr < 0.01
    assert auc.contains(e_star) and auc.stderr < 0.01


# ---------------------------------------------------------------- Gaussian models


def test_mean_shift_closed_forms_of_theory_md() -> None:
    a, sigma, tau = 0.8, 1.3, 0.6
    model = GaussianMeanShift(a, sigma)
    k = a / (sigma * math.sqrt(2))
    assert model.optimal_risk(tau) == pytest.approx(-tau * a**2 / sigma**2)
    assert model.optimal_auc() == pytest.approx(0.5 + k / (2 * math.sqrt(1 + k * k)))
    for c, theta in [(0.3, 0.0), (1.0, 0.7), (2.0, 2.5), (0.5, -1.2)]:
        s = rotation_scorer(c, theta)
        beta = sigma**2 * c / tau
        excess = tau / sigma**2 * (a**2 - 2 * a * beta * math.cos(theta) + beta**2)
        assert model.risk(s, tau) - model.optimal_risk(tau) == pytest.approx(excess, abs=1e-12)
        k_theta = a * math.cos(theta) / (sigma * math.sqrt(2))
        assert model.auc(s) == pytest.approx(0.5 + k_theta / (2 * math.sqrt(1 + k_theta**2)),
                                             abs=1e-12)
    # The optimal bilinear part reaches L* and E*.
    w_star = BilinearScorer(model.optimal_weight(tau))
    assert model.risk(w_star, tau) == pytest.approx(model.optimal_risk(tau), abs=1e-12)
    assert model.auc(w_star) == pytest.approx(model.optimal_auc(), abs=1e-12)


@pytest.mark.parametrize(("scale", "theta"), [(0.4, 0.0), (0.6, 1.0), (0.3, 2.2)])
def test_mean_shift_rotated_scorers_against_monte_carlo(scale: float, theta: float) -> None:
    model = GaussianMeanShift(0.7, 1.0)
    tau = 1.0
    s = rotation_scorer(scale, theta)
    g = torch.Generator().manual_seed(11)
    risk = mc_risk(model, s, tau, num_anchors=ANCHORS, num_negatives=NEGATIVES, generator=g)
    auc = mc_auc(model, s, num_anchors=ANCHORS, num_negatives=16, generator=g)
    assert risk.contains(model.risk(s, tau)), (risk, model.risk(s, tau))
    assert auc.contains(model.auc(s)), (auc, model.auc(s))


def test_general_bilinear_auc_quadrature_against_monte_carlo() -> None:
    model = GaussianMeanShift(1.0, 0.8)
    w = np.array([[1.0, 0.7], [-0.2, 0.3]])  # not a scaled rotation
    g = torch.Generator().manual_seed(3)
    auc = mc_auc(model, BilinearScorer(w), num_anchors=2 * ANCHORS, num_negatives=16, generator=g)
    exact = model.auc(w)
    assert auc.contains(exact), (auc, exact)
    # The quadrature also reproduces the rotation closed form when handed a rotation.
    rot = rotation_scorer(1.5, 0.9).weight
    k = 1.0 * math.cos(0.9) / (0.8 * math.sqrt(2))
    bent = rot + np.array([[0.0, 1e-9], [0.0, 0.0]])  # forces the general path
    assert model.auc(bent) == pytest.approx(0.5 + k / (2 * math.sqrt(1 + k * k)), abs=1e-8)


def test_mean_shift_in_higher_dimension_and_log_ratio() -> None:
    model = GaussianMeanShift(0.9, 1.1, dim=4)
    tau = 0.8
    g = torch.Generator().manual_seed(5)
    x, y = model.sample(5, g)
    assert x.shape == (5, 4) and x.dtype == torch.float64
    ref = (-((y - 0.9 * x) ** 2).sum(-1) + (y**2).sum(-1)) / (2 * 1.1**2)
    assert torch.allclose(model.log_density_ratio(x, y), ref)
    scorer = model.optimal_scorer(tau)
    risk = mc_risk(model, scorer, tau, num_anchors=ANCHORS, num_negatives=NEGATIVES, generator=g)
    auc = mc_auc(model, scorer, num_anchors=ANCHORS, num_negatives=16, generator=g)
    assert risk.contains(model.optimal_risk(tau)), (risk, model.optimal_risk(tau))
    assert auc.contains(model.optimal_auc()), (auc, model.optimal_auc())
    with pytest.raises(CrlValueError, match="dim=2"):
        model.auc(np.diag([1.0, 2.0, 3.0, 4.0]))


@pytest.mark.parametrize(("rho", "dim"), [(0.6, 1), (-0.5, 2), (0.8, 3)])
def test_correlated_gaussian_against_monte_carlo(rho: float, dim: int) -> None:
    model = CorrelatedGaussian(rho, dim)
    tau = 1.0
    assert model.optimal_risk(tau) == pytest.approx(tau * dim / 2 * math.log(1 - rho**2))
    g = torch.Generator().manual_seed(13)
    scorer = model.optimal_scorer(tau)
    risk = mc_risk(model, scorer, tau, num_anchors=ANCHORS, num_negatives=NEGATIVES, generator=g)
    auc = mc_auc(model, scorer, num_anchors=ANCHORS, num_negatives=16, generator=g)
    assert risk.contains(model.optimal_risk(tau)), (risk, model.optimal_risk(tau))
    assert auc.contains(model.optimal_auc()), (auc, model.optimal_auc())
    w = 0.5 * np.eye(dim)
    auc_w = mc_auc(model, BilinearScorer(w), num_anchors=ANCHORS, num_negatives=16, generator=g)
    risk_w = mc_risk(model, BilinearScorer(w), tau, num_anchors=ANCHORS, num_negatives=NEGATIVES,
                     generator=g)
    assert auc_w.contains(model.auc(w)) and risk_w.contains(model.risk(w, tau))
    assert model.auc(w) <= model.optimal_auc() + 1e-9


def test_gaussian_bad_input() -> None:
    with pytest.raises(CrlValueError, match="rho"):
        CorrelatedGaussian(1.0, 2)
    with pytest.raises(CrlValueError, match="sigma"):
        GaussianMeanShift(1.0, -1.0)
    with pytest.raises(CrlTypeError, match="bilinear"):
        GaussianMeanShift(1.0, 1.0).risk(lambda x, y: x.sum(-1), 1.0)
    with pytest.raises(CrlValueError, match="shape"):
        GaussianMeanShift(1.0, 1.0).risk(np.eye(3), 1.0)
