"""Identities and bounds the losses of crl.losses must satisfy, checked with hypothesis."""

from __future__ import annotations

import math
import warnings
from itertools import pairwise

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits
from torch import Tensor

from crl.losses import (
    clip_loss,
    contrastive_risk,
    info_nce,
    oce_risk,
    pairwise_risk,
    relaxed_kmeans,
    siglip_loss,
    supcon_loss,
)
from shared_tensors import make_pair

PROPERTY = settings(max_examples=30, deadline=None)
SLOW_PROPERTY = settings(max_examples=20, deadline=None)
CLOSE = {"rtol": 1e-9, "atol": 1e-10}

seeds = st.integers(0, 2**31 - 1)
batches = st.integers(2, 7)
dims = st.integers(1, 6)
temperatures = st.floats(0.05, 5.0)
scales = st.floats(0.5, 50.0)
biases = st.floats(-10.0, 10.0)
finite = st.floats(-5.0, 5.0, allow_nan=False, allow_infinity=False)


def _gaussian(*shape: int, seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def _pair(batch: int, dim: int, seed: int) -> tuple[Tensor, Tensor]:
    return make_pair(batch, dim, seed=seed)


def _negatives_mask(batch: int, seed: int) -> Tensor:
    """A random ``(B, B)`` negatives mask in which every row has a negative besides ``i``."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, batch, generator=gen) < 0.5
    mask[torch.arange(batch), (torch.arange(batch) + 1) % batch] = True
    return mask


def _deltas(rows: int = 4, cols: int = 8) -> st.SearchStrategy[np.ndarray]:
    shapes = st.tuples(st.integers(1, rows), st.integers(1, cols))
    return shapes.flatmap(lambda shape: arrays(np.float64, shape, elements=finite))


# --- symmetry in (a, b) -------------------------------------------------------------------


@PROPERTY
@given(batch=batches, dim=dims, seed=seeds, tau=temperatures, masked=st.booleans())
def test_symmetric_info_nce_is_symmetric(batch: int, dim: int, seed: int, tau: float,
                                         masked: bool) -> None:
    a, b = _pair(batch, dim, seed)
    mask = _negatives_mask(batch, seed) if masked else None
    swapped_mask = None if mask is None else mask.T
    torch.testing.assert_close(
        info_nce(a, b, temperature=tau, symmetric=True, negatives_mask=mask),
        info_nce(b, a, temperature=tau, symmetric=True, negatives_mask=swapped_mask), **CLOSE)


@PROPERTY
@given(batch=batches, dim=dims, seed=seeds, scale=scales, bias=biases)
def test_clip_and_siglip_are_symmetric(batch: int, dim: int, seed: int, scale: float,
                                       bias: float) -> None:
    a, b = _pair(batch, dim, seed)
    torch.testing.assert_close(clip_loss(a, b, scale), clip_loss(b, a, scale), **CLOSE)
    torch.testing.assert_close(siglip_loss(a, b, scale, bias), siglip_loss(b, a, scale, bias),
                               **CLOSE)


@PROPERTY
@given(batch=batches, dim=dims, seed=seeds, scale=scales)
def test_clip_loss_is_symmetric_info_nce_at_tau_one_over_scale(batch: int, dim: int, seed: int,
                                                               scale: float) -> None:
    a, b = _pair(batch, dim, seed)
    torch.testing.assert_close(clip_loss(a, b, scale),
                               info_nce(a, b, temperature=1.0 / scale, symmetric=True), **CLOSE)


# --- invariances --------------------------------------------------------------------------


@PROPERTY
@given(batch=batches, dim=dims, seed=seeds, tau=temperatures, masked=st.booleans(),
       shift_scale=st.floats(0.0, 20.0))
def test_row_shift_of_scores_leaves_info_nce_and_contrastive_risk_unchanged(
        batch: int, dim: int, seed: int, tau: float, masked: bool, shift_scale: float) -> None:
    # Appending c_i to a[i] and 1 to every b[j] adds c_i to the whole row i of s = a @ b.T.
    a, b = _pair(batch, dim, seed)
    shift = shift_scale * _gaussian(batch, 1, seed=seed + 2)
    a_shifted = torch.cat([a, shift], dim=1)
    b_shifted = torch.cat([b, torch.ones(batch, 1, dtype=b.dtype)], dim=1)
    mask = _negatives_mask(batch, seed) if masked else None
    tol = {"rtol": 1e-9, "atol": 1e-8 * (1 + shift_scale / tau)}
    torch.testing.assert_close(info_nce(a_shifted, b_shifted, temperature=tau,
                                        negatives_mask=mask),
                               info_nce(a, b, temperature=tau, negatives_mask=mask), **tol)
    torch.testing.assert_close(contrastive_risk(a_shifted, b_shifted, temperature=tau,
                                                negatives_mask=mask),
                               contrastive_risk(a, b, temperature=tau, negatives_mask=mask),
                               rtol=1e-9, atol=1e-8 * (1 + shift_scale))


@PROPERTY
@given(n_per_class=st.integers(1, 3), classes=st.integers(1, 4), dim=dims, seed=seeds,
       tau=temperatures)
def test_supcon_is_invariant_to_relabelling_and_sample_order(n_per_class: int, classes: int,
                                                             dim: int, seed: int,
                                                             tau: float) -> None:
    labels = torch.arange(classes).repeat_interleave(n_per_class + 1)  # every class has >= 2
    z = _gaussian(labels.shape[0], dim, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(labels.shape[0], generator=gen)
    relabel = torch.randperm(classes, generator=gen) * 7 - 3
    expected = supcon_loss(z, labels, temperature=tau)
    torch.testing.assert_close(supcon_loss(z[perm], labels[perm], temperature=tau), expected,
                               **CLOSE)
    torch.testing.assert_close(supcon_loss(z, relabel[labels], temperature=tau), expected,
                               **CLOSE)


# --- identities between losses ------------------------------------------------------------


@PROPERTY
@given(batch=batches, dim=dims, seed=seeds, tau=temperatures, masked=st.booleans())
def test_contrastive_risk_is_tau_times_positive_excluded_info_nce_minus_log_m(
        batch: int, dim: int, seed: int, tau: float, masked: bool) -> None:
    a, b = _pair(batch, dim, seed)
    mask = _negatives_mask(batch, seed) if masked else None
    negatives = ~torch.eye(batch, dtype=torch.bool)
    if mask is not None:
        negatives &= mask
    logits = (a @ b.T) / tau
    # InfoNCE with only the negatives in the denominator, per anchor.
    excluded = torch.logsumexp(logits.masked_fill(~negatives, -math.inf), dim=1) - logits.diag()
    m = negatives.sum(dim=1).to(torch.float64)
    expected = (tau * (excluded - torch.log(m))).mean()
    risk = contrastive_risk(a, b, temperature=tau, negatives_mask=mask)
    torch.testing.assert_close(risk, expected, **CLOSE)
    # ... and it is the KL-OCE of the score differences over each anchor's negatives.
    scores = a @ b.T
    delta = scores - scores.diag().unsqueeze(1)
    torch.testing.assert_close(oce_risk(delta, phi="kl", temperature=tau, mask=negatives), risk,
                               **CLOSE)


@PROPERTY
@given(batch=batches, dim=dims, seed=seeds, tau=temperatures, masked=st.booleans())
def test_info_nce_with_all_logits_equal_is_log_of_candidate_count(
        batch: int, dim: int, seed: int, tau: float, masked: bool) -> None:
    # Every a[i] = u and every b[j] = v: all scores equal u . v.
    u, v = _gaussian(1, dim, seed=seed), _gaussian(1, dim, seed=seed + 1)
    a, b = u.expand(batch, dim), v.expand(batch, dim)
    mask = _negatives_mask(batch, seed) if masked else None
    negatives = ~torch.eye(batch, dtype=torch.bool)
    if mask is not None:
        negatives &= mask
    expected = torch.log1p(negatives.sum(dim=1).to(torch.float64)).mean()
    torch.testing.assert_close(info_nce(a, b, temperature=tau, negatives_mask=mask), expected,
                               **CLOSE)
    if mask is None:
        assert float(expected) == pytest.approx(math.log(batch), rel=1e-12)
        torch.testing.assert_close(clip_loss(a, b, 1.0 / tau),
                                   torch.tensor(math.log(batch), dtype=torch.float64), **CLOSE)


# --- OCE risks ----------------------------------------------------------------------------


@PROPERTY
@given(delta=_deltas(), tau=temperatures)
def test_oce_kl_is_log_mean_exp_and_the_inner_minimum(delta: np.ndarray, tau: float) -> None:
    d = torch.from_numpy(delta)
    value = oce_risk(d, phi="kl", temperature=tau)
    per_row = tau * (torch.logsumexp(d / tau, dim=1) - math.log(d.shape[1]))
    torch.testing.assert_close(value, per_row.mean(), **CLOSE)

    def objective(mu: Tensor) -> Tensor:  # mu + mean phi_tau(d - mu), phi_tau = tau (e^{t/tau}-1)
        return mu + (tau * torch.expm1((d - mu.unsqueeze(1)) / tau)).mean(dim=1)

    at_minimum = objective(per_row)
    torch.testing.assert_close(at_minimum, per_row, rtol=1e-9, atol=1e-9)
    for step in (1e-3, 1e-1, 1.0):
        assert bool((objective(per_row + step) >= at_minimum - 1e-9).all())
        assert bool((objective(per_row - step) >= at_minimum - 1e-9).all())


def _row_means_and_maxes(d: Tensor) -> tuple[float, float]:
    return float(d.mean(dim=1).mean()), float(d.amax(dim=1).mean())


@PROPERTY
@given(delta=_deltas(), tau=temperatures,
       alpha=st.floats(0.01, 1.0, exclude_min=False))
def test_oce_risks_lie_between_mean_and_max(delta: np.ndarray, tau: float, alpha: float) -> None:
    d = torch.from_numpy(delta)
    mean, peak = _row_means_and_maxes(d)
    slack = 1e-9 * (1 + abs(mean) + abs(peak))
    for value in (oce_risk(d, phi="kl", temperature=tau), oce_risk(d, phi="cvar", alpha=alpha),
                  oce_risk(d, phi="softplus")):
        assert mean - slack <= float(value) <= peak + slack


@PROPERTY
@given(delta=_deltas(), alphas=st.lists(st.floats(0.01, 1.0), min_size=2, max_size=4))
def test_cvar_extremes_and_monotonicity(delta: np.ndarray, alphas: list[float]) -> None:
    d = torch.from_numpy(delta)
    mean, peak = _row_means_and_maxes(d)
    assert float(oce_risk(d, phi="cvar", alpha=1.0)) == pytest.approx(mean, rel=1e-12, abs=1e-12)
    small = 1.0 / d.shape[1]  # the top 1/M fraction is the row's max
    assert float(oce_risk(d, phi="cvar", alpha=small)) == pytest.approx(peak, rel=1e-12,
                                                                         abs=1e-12)
    assert float(oce_risk(d, phi="cvar", alpha=small / 3)) == pytest.approx(peak, rel=1e-12,
                                                                             abs=1e-12)
    values = [float(oce_risk(d, phi="cvar", alpha=alpha)) for alpha in sorted(alphas)]
    assert all(x >= y - 1e-12 for x, y in pairwise(values))


@PROPERTY
@given(delta=_deltas(), shift=st.floats(-50.0, 50.0), tau=temperatures,
       alpha=st.floats(0.01, 1.0))
def test_oce_risks_are_translation_equivariant(delta: np.ndarray, shift: float, tau: float,
                                               alpha: float) -> None:
    # OCE(Z + c) = OCE(Z) + c: mu absorbs the shift.
    d = torch.from_numpy(delta)
    for kwargs in ({"phi": "kl", "temperature": tau}, {"phi": "cvar", "alpha": alpha},
                   {"phi": "softplus"}):
        shifted = oce_risk(d + shift, **kwargs)  # type: ignore[arg-type]
        torch.testing.assert_close(shifted, oce_risk(d, **kwargs) + shift,  # type: ignore[arg-type]
                                   rtol=1e-9, atol=1e-9)


@PROPERTY
@given(row=st.integers(1, 8).flatmap(lambda m: arrays(np.float64, (1, m), elements=finite)))
def test_exponential_pairwise_risk_is_exp_of_unit_temperature_kl_oce(row: np.ndarray) -> None:
    d = torch.from_numpy(row)
    torch.testing.assert_close(torch.log(pairwise_risk(d, loss="exponential")),
                               oce_risk(d, phi="kl", temperature=1.0), **CLOSE)


@PROPERTY
@given(delta=_deltas())
def test_pairwise_surrogates_are_ordered_and_nonnegative(delta: np.ndarray) -> None:
    # hinge <= squared hinge + 1/4 (t <= t^2 + 1/4) and every surrogate is >= 0; at delta = 0
    # logistic is log 2 and exponential, hinge, squared hinge are 1.
    d = torch.from_numpy(delta)
    values = {loss: float(pairwise_risk(d, loss=loss))  # type: ignore[arg-type]
              for loss in ("logistic", "exponential", "squared_hinge", "hinge")}
    assert all(v >= 0 for v in values.values())
    assert values["hinge"] <= values["squared_hinge"] + 0.25 + 1e-12
    assert values["logistic"] <= values["exponential"] + 1e-12  # log(1 + x) <= x
    zero = torch.zeros_like(d)
    assert float(pairwise_risk(zero, loss="logistic")) == pytest.approx(math.log(2))
    for loss in ("exponential", "squared_hinge", "hinge"):
        assert float(pairwise_risk(zero, loss=loss)) == pytest.approx(1.0)  # type: ignore[arg-type]


# --- relaxed k-means ----------------------------------------------------------------------


@SLOW_PROPERTY
@given(batch=st.integers(3, 10), dim=st.integers(1, 4), data=st.data(), seed=seeds)
def test_relaxed_kmeans_lower_bounds_kmeans_inertia(batch: int, dim: int,
                                                    data: st.DataObject, seed: int) -> None:
    k = data.draw(st.integers(1, min(dim, batch)), label="k")
    centres = 3.0 * _gaussian(k, dim, seed=seed)
    z = centres[torch.arange(batch) % k] + 0.5 * _gaussian(batch, dim, seed=seed + 1)
    # One thread: OpenMP start-up dominates on data this small and the cores are shared.
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore")
        inertia = KMeans(n_clusters=k, n_init=4, random_state=0).fit(z.numpy()).inertia_
    bound = float(relaxed_kmeans(z, k))
    assert -1e-9 <= bound <= inertia * (1 + 1e-9) + 1e-9
    # More clusters never raise the bound: it drops one more eigenvalue.
    if k < dim:
        assert float(relaxed_kmeans(z, k + 1)) <= bound + 1e-9


@PROPERTY
@given(batch=st.integers(2, 9), dim=st.integers(1, 6), data=st.data(), seed=seeds)
def test_relaxed_kmeans_is_zero_when_rank_at_most_k(batch: int, dim: int, data: st.DataObject,
                                                    seed: int) -> None:
    k = data.draw(st.integers(1, dim), label="k")
    rank = data.draw(st.integers(1, k), label="rank")
    z = _gaussian(batch, rank, seed=seed) @ _gaussian(rank, dim, seed=seed + 1)  # rank <= k
    scale = float((z**2).sum())
    z.requires_grad_(True)
    value = relaxed_kmeans(z, k)
    assert abs(float(value.detach())) <= 1e-10 * (1 + scale)
    # Repeated (zero) eigenvalues do not break the gradient: eigvalsh's backward needs no gaps.
    (grad,) = torch.autograd.grad(value, [z])
    assert bool(torch.isfinite(grad).all())
