"""Parity of every loss of crl.losses with the float64 loop references: forward and gradient."""

from __future__ import annotations

import pytest
import torch
from loss_reference import (
    ref_clip_loss,
    ref_contrastive_risk,
    ref_info_nce,
    ref_oce_cvar,
    ref_oce_kl,
    ref_oce_softplus,
    ref_pairwise_risk,
    ref_relaxed_kmeans,
    ref_relaxed_kmeans_grad,
    ref_siglip_loss,
    ref_supcon_loss,
)
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
from shared_tensors import make_leaf as _leaf

TOL = {"rtol": 1e-10, "atol": 1e-12}
SHAPES = [(2, 3), (5, 4), (8, 16)]


def _negatives_mask(batch: int, seed: int) -> Tensor:
    """A random ``(B, B)`` mask (random diagonal too) in which every row has a negative."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, batch, generator=gen) < 0.5
    for i in range(batch):
        mask[i, (i + 1) % batch] = True
    return mask


def _valid_mask(rows: int, cols: int, seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, cols, generator=gen) < 0.6
    mask[torch.arange(rows), torch.randint(cols, (rows,), generator=gen)] = True
    return mask


def _assert_same_value_and_grads(ours: Tensor, ref: Tensor, inputs: list[Tensor],
                                 grad_tol: dict[str, float] | None = None) -> None:
    assert ours.dim() == 0
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, ref, **TOL)
    ours_grads = torch.autograd.grad(ours, inputs)
    ref_grads = torch.autograd.grad(ref, inputs)
    for g, r in zip(ours_grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, **(grad_tol or TOL))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_info_nce_matches_reference(shape: tuple[int, int], symmetric: bool,
                                    masked: bool) -> None:
    a, b = _leaf(*shape, seed=1), _leaf(*shape, seed=2)
    tau = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    mask = _negatives_mask(shape[0], seed=3) if masked else None
    ours = info_nce(a, b, temperature=tau, symmetric=symmetric, negatives_mask=mask)
    ref = ref_info_nce(a, b, tau, symmetric=symmetric, negatives_mask=mask)
    _assert_same_value_and_grads(ours, ref, [a, b, tau])


@pytest.mark.parametrize("temperature", [0.07, 1.0])
def test_info_nce_default_and_float_temperature(temperature: float) -> None:
    a, b = _leaf(6, 5, seed=4), _leaf(6, 5, seed=5)
    _assert_same_value_and_grads(info_nce(a, b, temperature=temperature),
                                 ref_info_nce(a, b, temperature), [a, b])
    # The default temperature is 0.07.
    torch.testing.assert_close(info_nce(a, b), ref_info_nce(a, b, 0.07), **TOL)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [1.0, 1 / 0.07, 100.0])
def test_clip_loss_matches_reference(shape: tuple[int, int], scale: float) -> None:
    a, b = _leaf(*shape, seed=6, scale=0.3), _leaf(*shape, seed=7, scale=0.3)
    s = torch.tensor(scale, dtype=torch.float64, requires_grad=True)
    _assert_same_value_and_grads(clip_loss(a, b, s), ref_clip_loss(a, b, s), [a, b, s])
    torch.testing.assert_close(clip_loss(a, b, scale), ref_clip_loss(a, b, scale), **TOL)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("scale", "bias"), [(10.0, -10.0), (1.0, 0.0), (3.5, 2.0)])
def test_siglip_loss_matches_reference(shape: tuple[int, int], scale: float,
                                       bias: float) -> None:
    a, b = _leaf(*shape, seed=8), _leaf(*shape, seed=9)
    s = torch.tensor(scale, dtype=torch.float64, requires_grad=True)
    c = torch.tensor(bias, dtype=torch.float64, requires_grad=True)
    _assert_same_value_and_grads(siglip_loss(a, b, s, c), ref_siglip_loss(a, b, s, c),
                                 [a, b, s, c])
    torch.testing.assert_close(siglip_loss(a, b, scale, bias),
                               ref_siglip_loss(a, b, scale, bias), **TOL)


@pytest.mark.parametrize(
    "labels",
    [
        [0, 0, 1, 1],
        [0, 1, 0, 1, 2, 2, 2],
        [3, 1, 4, 1, 5, 9, 2, 6, 5, 3],  # singletons 4, 9, 2, 6 are left out as anchors
        [7, 7],
    ],
)
@pytest.mark.parametrize("temperature", [0.1, 0.5])
def test_supcon_matches_reference(labels: list[int], temperature: float) -> None:
    z = _leaf(len(labels), 4, seed=10)
    y = torch.tensor(labels)
    tau = torch.tensor(temperature, dtype=torch.float64, requires_grad=True)
    _assert_same_value_and_grads(supcon_loss(z, y, temperature=tau),
                                 ref_supcon_loss(z, y, tau), [z, tau])
    torch.testing.assert_close(supcon_loss(z, y, temperature=temperature),
                               ref_supcon_loss(z, y, temperature), **TOL)


def test_supcon_default_temperature_is_0_1() -> None:
    z, y = _leaf(6, 3, seed=11), torch.tensor([0, 1, 2, 0, 1, 2])
    torch.testing.assert_close(supcon_loss(z, y), ref_supcon_loss(z, y, 0.1), **TOL)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("temperature", [0.05, 1.0])
def test_contrastive_risk_matches_reference(shape: tuple[int, int], masked: bool,
                                            temperature: float) -> None:
    a, b = _leaf(*shape, seed=12), _leaf(*shape, seed=13)
    tau = torch.tensor(temperature, dtype=torch.float64, requires_grad=True)
    mask = _negatives_mask(shape[0], seed=14) if masked else None
    _assert_same_value_and_grads(contrastive_risk(a, b, temperature=tau, negatives_mask=mask),
                                 ref_contrastive_risk(a, b, tau, negatives_mask=mask),
                                 [a, b, tau])


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (4, 7), (6, 3)])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("temperature", [0.05, 1.0])
def test_oce_kl_matches_reference(shape: tuple[int, int], masked: bool,
                                  temperature: float) -> None:
    delta = _leaf(*shape, seed=15)
    mask = _valid_mask(*shape, seed=16) if masked else None
    _assert_same_value_and_grads(
        oce_risk(delta, phi="kl", temperature=temperature, mask=mask),
        ref_oce_kl(delta, temperature, mask=mask), [delta])


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (4, 7), (6, 3), (3, 10)])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.3, 0.13, 0.01])
def test_oce_cvar_matches_reference(shape: tuple[int, int], masked: bool, alpha: float) -> None:
    delta = _leaf(*shape, seed=17)
    mask = _valid_mask(*shape, seed=18) if masked else None
    _assert_same_value_and_grads(oce_risk(delta, phi="cvar", alpha=alpha, mask=mask),
                                 ref_oce_cvar(delta, alpha, mask=mask), [delta])


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (4, 7), (6, 3)])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("spread", [0.1, 1.0, 20.0])
def test_oce_softplus_matches_reference(shape: tuple[int, int], masked: bool,
                                        spread: float) -> None:
    delta = _leaf(*shape, seed=19, scale=spread)
    mask = _valid_mask(*shape, seed=20) if masked else None
    # Minimising by function values locates the reference ``mu`` only to about 1e-8 (the objective
    # is quadratic there): the value is exact to rounding, the envelope gradient to ~1e-8.
    _assert_same_value_and_grads(oce_risk(delta, phi="softplus", mask=mask),
                                 ref_oce_softplus(delta, mask=mask), [delta],
                                 grad_tol={"rtol": 1e-6, "atol": 1e-7})


@pytest.mark.parametrize("loss", ["logistic", "exponential", "squared_hinge", "hinge"])
@pytest.mark.parametrize("masked", [False, True])
def test_pairwise_risk_matches_reference(loss: str, masked: bool) -> None:
    delta = _leaf(5, 6, seed=21, scale=1.5)
    mask = _valid_mask(5, 6, seed=22) if masked else None
    _assert_same_value_and_grads(pairwise_risk(delta, loss=loss, mask=mask),  # type: ignore[arg-type]
                                 ref_pairwise_risk(delta, loss, mask=mask), [delta])


def test_pairwise_risk_default_is_logistic() -> None:
    delta = _leaf(3, 4, seed=23)
    torch.testing.assert_close(pairwise_risk(delta), ref_pairwise_risk(delta, "logistic"), **TOL)


@pytest.mark.parametrize("shape", [(6, 3), (3, 6), (5, 5), (8, 2), (1, 4)])
def test_relaxed_kmeans_matches_reference(shape: tuple[int, int]) -> None:
    z = _leaf(*shape, seed=24)
    for k in range(1, shape[1] + 1):
        ours = relaxed_kmeans(z, k)
        assert ours.dim() == 0 and ours.dtype == torch.float64
        assert float(ours.detach()) == pytest.approx(ref_relaxed_kmeans(z, k), rel=1e-10, abs=1e-10)
        (grad,) = torch.autograd.grad(ours, [z])
        expected = torch.from_numpy(ref_relaxed_kmeans_grad(z, k))
        torch.testing.assert_close(grad, expected, rtol=1e-8, atol=1e-9)
