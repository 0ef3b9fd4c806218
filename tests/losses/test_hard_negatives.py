"""Hard negatives (``hard (B, H, D)``): extra candidates of their own anchor only, in the
``a -> b`` direction of InfoNCE, the CLIP loss and GCL, plain and tiled, counted in the anchor's
m (docs/theory.md §8), against loops written from the formula in float64, plus gradcheck."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from loss_reference import ref_logsumexp
from torch import Tensor

from crl.losses import GlobalContrastiveLoss, LossConfig, build_objective
from crl.losses.base import LogitScaleInit, PairBatch
from crl.negatives import NegativesConfig, NegativeSets

N, B, H, D = 40, 6, 2, 4


def _data(seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    za = torch.nn.functional.normalize(torch.randn(B, D, generator=g, dtype=torch.float64), dim=1)
    zb = torch.nn.functional.normalize(za + torch.randn(B, D, generator=g, dtype=torch.float64),
                                       dim=1)
    hard = torch.nn.functional.normalize(zb.unsqueeze(1) + 0.3 * torch.randn(
        B, H, D, generator=g, dtype=torch.float64), dim=2)
    return za, zb, hard, torch.randperm(N, generator=g)[:B]


def _dot(u: Tensor, v: Tensor) -> Tensor:
    return sum((u[d] * v[d] for d in range(1, u.shape[0])), u[0] * v[0])


def _negatives(mask: Tensor | None, i: int) -> list[int]:
    return [j for j in range(B) if j != i and (mask is None or bool(mask[i, j]))]


def ref_info_nce_terms(za: Tensor, zb: Tensor, hard: Tensor, scale: float, mask: Tensor | None,
                       symmetric: bool) -> list[list[Tensor]]:
    """Per direction, per anchor: ``-log(exp(L_ii) / (exp(L_ii) + sum_neg exp(L_ij) +
    sum_k exp(L_ik)))``; the hard negatives ``L_ik = scale * za_i . hard_ik`` in ``a -> b``."""
    out = []
    for direction, (x, y) in enumerate([(za, zb), (zb, za)][:2 if symmetric else 1]):
        terms = []
        for i in range(B):
            positive = scale * _dot(x[i], y[i])
            logits = [positive] + [scale * _dot(x[i], y[j]) for j in _negatives(mask, i)]
            if direction == 0:
                logits += [scale * _dot(x[i], hard[i, k]) for k in range(H)]
            terms.append(ref_logsumexp(logits) - positive)
        out.append(terms)
    return out


def _mean_loss(terms: list[list[Tensor]]) -> Tensor:
    return sum(sum(t) / len(t) for t in terms) / len(terms)


def _objective(loss: dict[str, Any], negatives: dict[str, Any] | None = None,
               block_size: int | None = None) -> Any:
    return build_objective(LossConfig(**loss, block_size=block_size),
                           NegativesConfig(**(negatives or {})), num_samples=N,
                           logit_scale=LogitScaleInit(init=math.log(3.0))).double()


CASES = [({"name": "info_nce", "temperature": 0.5, "symmetric": True}, 2.0),
         ({"name": "info_nce", "temperature": 0.5, "symmetric": False}, 2.0),
         ({"name": "clip"}, 3.0)]


@pytest.mark.parametrize("block_size", [None, 2], ids=["plain", "tiled"])
@pytest.mark.parametrize(("loss", "scale"), CASES, ids=["info_nce", "info_nce-1way", "clip"])
@pytest.mark.parametrize("regime", ["in_batch", "independent"])
def test_info_nce_and_clip_with_hard_negatives_match_the_loop(
        loss: dict[str, Any], scale: float, block_size: int | None, regime: str) -> None:
    za, zb, hard, index = _data(0)
    negatives = {} if regime == "in_batch" else {"regime": "independent", "m": 8, "seed": 3}
    objective = _objective(loss, negatives, block_size)
    if loss["name"] == "clip":  # exp of the float32 log(3) that the objective holds
        scale = float(objective.loss.logit_scale.detach().exp())
    mask = None if regime == "in_batch" else NegativeSets(N, 8, regime="independent",
                                                           seed=3).batch_mask(index)
    symmetric = loss.get("symmetric", True)
    leaves = [x.clone().requires_grad_(True) for x in (za, zb, hard)]
    value, _ = objective(*leaves[:2], index, None, hard=leaves[2])
    ref_leaves = [x.clone().requires_grad_(True) for x in (za, zb, hard)]
    want = _mean_loss(ref_info_nce_terms(*ref_leaves, scale, mask, symmetric))
    torch.testing.assert_close(value, want, rtol=1e-12, atol=1e-12)
    for got, expected in zip(torch.autograd.grad(value, leaves),
                             torch.autograd.grad(want, ref_leaves), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    # The terms of a slice of rows (a rank's anchors) are those anchors' terms.
    rows = slice(2, 5)
    terms = objective.loss.terms(PairBatch(za, zb, index, None, rows,
                                           objective.negatives(index, None, rows), hard))
    ref = ref_info_nce_terms(za, zb, hard, scale, mask, symmetric)
    for got_direction, ref_direction in zip(terms.values, ref, strict=True):
        torch.testing.assert_close(got_direction, torch.stack(ref_direction[rows]),
                                   rtol=1e-12, atol=1e-12)
    assert terms.counted is None or bool(terms.counted.all())  # every anchor has H negatives


def ref_gcl_log_g(za: Tensor, zb: Tensor, hard: Tensor, tau: float, mask: Tensor | None
                  ) -> list[Tensor]:
    """``log g_hat_i = log mean_{j in neg(i) + hard(i)} exp((s_ij - s_ii) / tau)`` (a -> b)."""
    out = []
    for i in range(B):
        positive = _dot(za[i], zb[i])
        deltas = [(_dot(za[i], zb[j]) - positive) / tau for j in _negatives(mask, i)]
        deltas += [(_dot(za[i], hard[i, k]) - positive) / tau for k in range(H)]
        out.append(ref_logsumexp(deltas) - math.log(len(deltas)))
    return out


@pytest.mark.parametrize("block_size", [None, 2], ids=["plain", "tiled"])
@pytest.mark.parametrize("regime", ["in_batch", "shared"])
def test_gcl_inner_mean_includes_the_hard_negatives(block_size: int | None, regime: str) -> None:
    za, zb, hard, index = _data(1)
    negatives = {} if regime == "in_batch" else {"regime": "shared", "m": 5, "seed": 2}
    tau, gamma = 0.3, 0.6
    objective = _objective({"name": "gcl", "temperature": tau, "symmetric": False,
                            "gcl": {"gamma": gamma}}, negatives, block_size)
    gcl = objective.loss
    assert isinstance(gcl, GlobalContrastiveLoss)
    mask = None if regime == "in_batch" else NegativeSets(N, 5, regime="shared",
                                                           seed=2).batch_mask(index)
    # Some anchors may have no in-batch negative under the shared set: they count by their H.
    objective(za, zb, index, None, hard=hard)  # first visit: u = g_hat
    first = torch.stack(ref_gcl_log_g(za, zb, hard, tau, mask))
    torch.testing.assert_close(gcl.log_u_a2b[index], first, rtol=1e-12, atol=1e-12)
    za2, zb2, hard2, _ = _data(2)  # same samples, new embeddings: the moving average
    leaves = [x.clone().requires_grad_(True) for x in (za2, zb2, hard2)]
    value, _ = objective(*leaves[:2], index, None, hard=leaves[2])
    ref_leaves = [x.clone().requires_grad_(True) for x in (za2, zb2, hard2)]
    log_g = torch.stack(ref_gcl_log_g(*ref_leaves, tau, mask))
    log_u = torch.logaddexp(math.log1p(-gamma) + first, math.log(gamma) + log_g.detach())
    torch.testing.assert_close(gcl.log_u_a2b[index], log_u, rtol=1e-12, atol=1e-12)
    want = (tau * torch.exp(log_g - log_u)).mean()  # tau g_hat / u, u detached
    torch.testing.assert_close(value, want, rtol=1e-12, atol=1e-12)
    for got, expected in zip(torch.autograd.grad(value, leaves),
                             torch.autograd.grad(want, ref_leaves), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("block_size", [None, 2], ids=["plain", "tiled"])
@pytest.mark.parametrize("loss", [{"name": "info_nce", "temperature": 0.5}, {"name": "clip"}])
def test_hard_negatives_gradcheck(loss: dict[str, Any], block_size: int | None) -> None:
    za, zb, hard, index = _data(3)
    objective = _objective(loss, {"regime": "independent", "m": 10, "seed": 1}, block_size)

    def fn(a: Tensor, b: Tensor, h: Tensor) -> Tensor:
        return objective(a, b, index, None, hard=h)[0]

    leaves = tuple(x.clone().requires_grad_(True) for x in (za, zb, hard))
    assert torch.autograd.gradcheck(fn, leaves)


def test_gcl_public_forward_takes_hard_negatives_and_checks_them() -> None:
    za, zb, hard, index = _data(4)
    gcl = GlobalContrastiveLoss(N, temperature=0.3, symmetric=False)
    gcl(za, zb, index, hard=hard)
    torch.testing.assert_close(gcl.log_u_a2b[index],
                               torch.stack(ref_gcl_log_g(za, zb, hard, 0.3, None)))
    with pytest.raises(ValueError, match=r"`hard` must have shape \(B, H, D\)"):
        gcl(za, zb, index, hard=hard[:, :, :2])
