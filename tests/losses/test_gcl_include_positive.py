"""GCL with the positive among each anchor's candidates (``include_positive``: InfoNCE without
its mini-batch bias): against the formula written as float64 loops, against InfoNCE's gradient
on a first visit, tiled equal to dense, and through the config."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from crl.losses import GlobalContrastiveLoss
from crl.negatives import NegativeSets


def _pair(b: int, d: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    p = F.normalize(a + 0.5 * torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    return a.requires_grad_(), p.requires_grad_()


def g_hat_with_positive(x: Tensor, y: Tensor, mask: Tensor, tau: float) -> list[Tensor | None]:
    """``mean over {i} and N_i of exp((s_ij - s_ii) / tau)`` (the positive's term is 1), None
    for an anchor without negatives."""
    out: list[Tensor | None] = []
    for i in range(x.shape[0]):
        negs = [torch.exp((x[i] @ y[j] - x[i] @ y[i]) / tau)
                for j in range(y.shape[0]) if j != i and bool(mask[i, j])]
        out.append((1 + sum(negs)) / (1 + len(negs)) if negs else None)  # type: ignore[arg-type]
    return out


def test_loss_and_gradient_equal_the_written_formula_with_old_estimates() -> None:
    n, b, tau = 20, 7, 0.1
    loss = GlobalContrastiveLoss(n, temperature=tau, gamma=0.6, include_positive=True)
    index = torch.tensor([1, 4, 6, 8, 11, 15, 19])
    loss(*_pair(b, 5, seed=5), index)  # the checked call mixes old u and new g_hat
    old = (loss.log_u_a2b.clone(), loss.log_u_b2a.clone())
    a, p = _pair(b, 5, seed=6)
    mask = torch.rand(b, b, generator=torch.Generator().manual_seed(0)) < 0.5
    mask[2] = False  # no negative: skipped, u unchanged
    value = loss(a, p, index, mask)
    got = torch.autograd.grad(value, (a, p))
    terms = []
    for x, y, state, before in ((a, p, loss.log_u_a2b, old[0]), (p, a, loss.log_u_b2a, old[1])):
        per = []
        for r, g in enumerate(g_hat_with_positive(x, y, mask, tau)):
            if g is None:
                continue
            u = 0.4 * before[index[r]].exp() + 0.6 * g.detach()  # the moving average
            assert float(state[index[r]].exp()) == pytest.approx(float(u), rel=1e-12)
            per.append(tau * g / u)
        terms.append(sum(per) / len(per))
    reference = sum(terms) / 2
    want = torch.autograd.grad(reference, (a, p))  # type: ignore[arg-type]
    torch.testing.assert_close(value, reference.detach(), rtol=1e-12, atol=0)  # type: ignore[union-attr]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-13)
    assert torch.equal(loss.log_u_a2b[index[2]], old[0][index[2]])


def test_first_visit_gradient_is_tau_times_info_nce() -> None:
    """u = g_hat on a first visit: the gradient of ``tau log g_hat``, i.e. tau x InfoNCE's
    (positive in the denominator) gradient; the default excludes the positive and differs."""
    n, b, tau = 30, 9, 0.2
    a, p = _pair(b, 6, seed=1)
    index = torch.arange(3, 3 + b)
    got = torch.autograd.grad(GlobalContrastiveLoss(n, temperature=tau, include_positive=True,
                                                    symmetric=False)(a, p, index), (a, p))
    logits = a @ p.T / tau
    info_nce = F.cross_entropy(logits, torch.arange(b))  # mean over anchors, positive included
    want = torch.autograd.grad(tau * info_nce, (a, p))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-13)
    excluded = torch.autograd.grad(GlobalContrastiveLoss(n, temperature=tau, symmetric=False)(
        a, p, index), (a, p))
    assert (excluded[0] - want[0]).abs().max() > 1e-3


@pytest.mark.parametrize("masking", ["none", "sets"])
def test_tiled_equals_dense(masking: str) -> None:
    n, batch = 120, 29
    sets = NegativeSets(n, 10, regime="shared", seed=2)
    dense = GlobalContrastiveLoss(n, temperature=0.1, include_positive=True)
    tiled = GlobalContrastiveLoss(n, temperature=0.1, include_positive=True, block_size=8)
    for step in range(3):
        index = torch.randperm(n, generator=torch.Generator().manual_seed(step))[:batch]
        outs = []
        for module, m in ((dense, None if masking == "none" else sets.batch_mask(index)),
                          (tiled, None if masking == "none" else sets)):
            a, p = (x.detach().clone().requires_grad_(True) for x in _pair(batch, 8, step))
            value = module(a, p, index, negatives_mask=m)
            outs.append((value.detach(), *torch.autograd.grad(value, (a, p))))
        for x, y in zip(*outs, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(dense.log_u_a2b, tiled.log_u_a2b, rtol=1e-10, atol=1e-12,
                                   equal_nan=True)


def test_the_config_option_reaches_the_loss_and_rejects_non_bools() -> None:
    from crl.errors import CrlTypeError
    from crl.train import load_config
    from crl.train.build import run_objective

    cfg = load_config("synthetic-gaussian", ["loss.name=gcl", "loss.gcl.include_positive=true"])
    objective = run_objective(cfg, num_samples=10, labels=None, epochs=1, num_classes=None)
    assert objective.loss.include_positive is True
    assert "include_positive=True" in repr(objective.loss)
    with pytest.raises(CrlTypeError, match="include_positive"):
        GlobalContrastiveLoss(10, include_positive=1)  # type: ignore[arg-type]
