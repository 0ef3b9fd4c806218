"""crl's GlobalContrastiveLoss against LibAUC's own bimodal GCL (``GCLoss_v2``, the SogCLR
estimator of Yuan et al. 2022) on the same tensors and the same state, over two steps.

LibAUC keeps ``u`` shifted by a running maximum ``b`` (``u_true = u * exp(b)``) and returns the
surrogate ``mean_i sum_j p_ij (s_ij - s_ii)`` with ``p_ij = exp((s_ij - s_ii) / tau) / u_i``
detached; crl returns ``tau * mean_i g_hat_i / u_i`` with ``g_hat_i`` the *mean* over the
``B - 1`` negatives. The two have the same gradient up to that factor: LibAUC's is ``B - 1``
times crl's. Its state is float32, hence the tolerances.
"""

from __future__ import annotations

import math

import pytest
import torch

from crl.losses import GlobalContrastiveLoss

contrastive = pytest.importorskip(
    "libauc.losses.contrastive", reason="LibAUC (pip install --no-deps libauc) is not importable")

N, B, TAU = 24, 8, 0.1


def _features(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.nn.functional.normalize(torch.randn(B, 16, generator=g), dim=1)
    b = torch.nn.functional.normalize(a + 0.8 * torch.randn(B, 16, generator=g), dim=1)
    return a, b


def _grads(loss: torch.Tensor, *inputs: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, inputs))


def _run(theirs: torch.nn.Module, ours: GlobalContrastiveLoss, index: torch.Tensor,
         seed: int) -> None:
    a, b = _features(seed)
    a1, b1 = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    a2, b2 = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    their_loss, _ = theirs(a1, b1, index)
    our_loss = ours(a2, b2, index)
    for got, want in zip(_grads(our_loss, a2, b2), _grads(their_loss, a1, b1), strict=True):
        torch.testing.assert_close(got * (B - 1), want, rtol=1e-4, atol=1e-6)
    # The same running estimates: log u_true = log u + b in LibAUC's shifted units.
    their_a2b = torch.log(theirs.u1[index].squeeze(1).double()) + theirs.b1[index].squeeze(1)
    their_b2a = torch.log(theirs.u2[index].squeeze(1).double()) + theirs.b2[index].squeeze(1)
    torch.testing.assert_close(ours.log_u_a2b[index], their_a2b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.log_u_b2a[index], their_b2a, rtol=1e-5, atol=1e-5)


def test_constant_gamma_two_steps() -> None:
    """First visit: u = g_hat in both; second visit of the same pairs: u <- 0.1 u + 0.9 g_hat."""
    theirs = contrastive.GCLoss_v2(N=N, tau=TAU, gamma=0.9)
    ours = GlobalContrastiveLoss(N, temperature=TAU, gamma=0.9, symmetric=True)
    index = torch.tensor([3, 7, 0, 21, 15, 9, 4, 12])
    _run(theirs, ours, index, seed=0)
    _run(theirs, ours, index[torch.randperm(B, generator=torch.Generator().manual_seed(1))],
         seed=1)


def test_cosine_gamma_schedule() -> None:
    """gamma from 1 at epoch 0 to gamma_min: LibAUC's adjust_gamma and crl's set_epoch agree."""
    theirs = contrastive.GCLoss_v2(N=N, tau=TAU, gamma=0.2, gamma_schedule="cosine",
                                   gamma_decay_epochs=4)
    ours = GlobalContrastiveLoss(N, temperature=TAU, gamma_schedule="cosine", gamma_min=0.2,
                                 decay_epochs=4, symmetric=True)
    index = torch.arange(2, 2 + B)
    _run(theirs, ours, index, seed=2)
    theirs.adjust_gamma(1)
    ours.set_epoch(1)
    assert ours.current_gamma == pytest.approx(theirs.gamma)
    assert ours.current_gamma == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)) * 0.8 + 0.2)
    _run(theirs, ours, index.flip(0), seed=3)
