"""torch.autograd.gradcheck in float64 for every loss of crl.losses, including the gradients with
respect to temperature, scale and bias tensors."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor
from torch.autograd import gradcheck

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
from shared_tensors import make_leaf as _leaf


def _scalar(value: float) -> Tensor:
    return torch.tensor(value, dtype=torch.float64, requires_grad=True)


def _check(fn: Callable[..., Tensor], *inputs: Tensor) -> None:
    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


NEGATIVES = torch.tensor(
    [[True, True, False, False, True],
     [False, False, True, False, False],
     [True, True, True, True, True],
     [False, True, False, False, True],
     [True, False, False, True, False]]
)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("mask", [None, NEGATIVES])
def test_info_nce_gradcheck(symmetric: bool, mask: Tensor | None) -> None:
    def fn(a: Tensor, b: Tensor, tau: Tensor) -> Tensor:
        return info_nce(a, b, temperature=tau, symmetric=symmetric, negatives_mask=mask)

    _check(fn, _leaf(5, 3, seed=0), _leaf(5, 3, seed=1), _scalar(0.4))


def test_clip_loss_gradcheck() -> None:
    _check(clip_loss, _leaf(4, 3, seed=2), _leaf(4, 3, seed=3), _scalar(2.5))


def test_clip_loss_gradcheck_through_logit_scale() -> None:
    def fn(a: Tensor, b: Tensor, logit_scale: Tensor) -> Tensor:
        return clip_loss(a, b, logit_scale.exp())

    _check(fn, _leaf(4, 3, seed=4), _leaf(4, 3, seed=5), _scalar(0.7))


def test_siglip_loss_gradcheck() -> None:
    _check(siglip_loss, _leaf(4, 3, seed=6), _leaf(4, 3, seed=7), _scalar(2.0), _scalar(-1.5))


def test_supcon_loss_gradcheck() -> None:
    labels = torch.tensor([0, 1, 0, 2, 1, 3])  # label 2 and 3 are left-out anchors

    def fn(z: Tensor, tau: Tensor) -> Tensor:
        return supcon_loss(z, labels, temperature=tau)

    _check(fn, _leaf(6, 3, seed=8), _scalar(0.5))


@pytest.mark.parametrize("mask", [None, NEGATIVES])
def test_contrastive_risk_gradcheck(mask: Tensor | None) -> None:
    def fn(a: Tensor, b: Tensor, tau: Tensor) -> Tensor:
        return contrastive_risk(a, b, temperature=tau, negatives_mask=mask)

    _check(fn, _leaf(5, 3, seed=9), _leaf(5, 3, seed=10), _scalar(0.3))


VALID = torch.tensor([[True, False, True, True, False, True, True],
                      [False, False, False, True, False, False, False],
                      [True, True, True, True, True, True, True]])


@pytest.mark.parametrize("mask", [None, VALID])
@pytest.mark.parametrize(
    "kwargs",
    [{"phi": "kl", "temperature": 0.3}, {"phi": "cvar", "alpha": 0.3},
     {"phi": "cvar", "alpha": 1.0}, {"phi": "softplus"}],
)
def test_oce_risk_gradcheck(mask: Tensor | None, kwargs: dict[str, object]) -> None:
    def fn(delta: Tensor) -> Tensor:
        return oce_risk(delta, mask=mask, **kwargs)  # type: ignore[arg-type]

    # Entries far apart, so finite differences never cross a CVaR kink (a tie in the order).
    _check(fn, _leaf(3, 7, seed=11, scale=2.0))


@pytest.mark.parametrize("mask", [None, VALID])
@pytest.mark.parametrize("loss", ["logistic", "exponential", "squared_hinge", "hinge"])
def test_pairwise_risk_gradcheck(mask: Tensor | None, loss: str) -> None:
    def fn(delta: Tensor) -> Tensor:
        return pairwise_risk(delta, loss=loss, mask=mask)  # type: ignore[arg-type]

    # Away from the hinge's kink at delta = -1.
    _check(fn, _leaf(3, 7, seed=12, scale=2.0))


@pytest.mark.parametrize(("shape", "k"), [((6, 3), 1), ((6, 3), 2), ((3, 6), 2), ((4, 4), 3)])
def test_relaxed_kmeans_gradcheck(shape: tuple[int, int], k: int) -> None:
    def fn(z: Tensor) -> Tensor:
        return relaxed_kmeans(z, k)

    _check(fn, _leaf(*shape, seed=13))
