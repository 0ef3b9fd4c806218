"""Numerics under stress: every loss finite with finite gradients in float32 and bfloat16, and
under bfloat16 autocast, at temperature 0.005 with un-normalised embeddings of norm up to 1e3;
clamped logit scales; GCL's ``log u`` state over many steps; a hypothesis fuzz against the float64
references."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loss_reference import (
    ref_clip_loss,
    ref_contrastive_risk,
    ref_info_nce,
    ref_oce_cvar,
    ref_oce_kl,
    ref_oce_softplus,
    ref_pairwise_risk,
)
from torch import Tensor

from crl.losses import (
    ClipLoss,
    GlobalContrastiveLoss,
    SigLipLoss,
    anchor_logsumexp,
    clip_loss,
    contrastive_risk,
    info_nce,
    oce_risk,
    pairwise_risk,
    relaxed_kmeans,
    siglip_loss,
    supcon_loss,
)
from crl.models import DualEncoder

TAU = 0.005
B, D = 8, 4


def _embeddings(seed: int, max_norm: float) -> tuple[Tensor, Tensor]:
    """``(B, D)`` float64 pairs with row norms spread log-uniformly over [1e-3, max_norm] (the
    largest rows exactly ``max_norm``); a few rows of ``b`` nearly parallel to other rows of
    ``a``, so some negatives score above their positive."""
    gen = torch.Generator().manual_seed(seed)
    a = F.normalize(torch.randn(B, D, generator=gen, dtype=torch.float64), dim=1)
    b = F.normalize(a + 0.5 * torch.randn(B, D, generator=gen, dtype=torch.float64), dim=1)
    b[0] = a[1]  # a hard negative: a[1] . b[0] = 1
    exponents = torch.linspace(-3, math.log10(max_norm), B, dtype=torch.float64)
    norms = 10.0 ** exponents[torch.randperm(B, generator=gen)]
    return a * norms.unsqueeze(1), b * norms.flip(0).unsqueeze(1)


def _delta(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """The ``(B, B)`` score differences ``s_ij - s_ii`` and the off-diagonal mask."""
    scores = a @ b.T
    return scores - scores.diagonal().unsqueeze(1), ~torch.eye(a.shape[0], dtype=torch.bool)


def _gcl(mode: str, block_size: int | None = None) -> Callable[[Tensor, Tensor], Tensor]:
    def run(a: Tensor, b: Tensor) -> Tensor:
        loss = GlobalContrastiveLoss(num_samples=20, temperature=TAU, temperature_mode=mode,
                                     block_size=block_size)
        index = torch.arange(3, 3 + a.shape[0])
        loss(a.detach(), b.detach(), index)  # a first visit, then the estimator proper
        return loss(a, b, index)
    return run


LABELS = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
MASK = torch.rand(B, B, generator=torch.Generator().manual_seed(3)) < 0.5
MASK[:, 0] = True
MASK[0, 1] = True  # every row has a negative besides the diagonal

LOSSES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "info_nce": lambda a, b: info_nce(a, b, temperature=TAU),
    "info_nce_symmetric": lambda a, b: info_nce(a, b, temperature=TAU, symmetric=True),
    "info_nce_masked": lambda a, b: info_nce(a, b, temperature=TAU, negatives_mask=MASK),
    "clip_loss": lambda a, b: clip_loss(a, b, 1 / TAU),
    "siglip_loss": lambda a, b: siglip_loss(a, b, 1 / TAU, -10.0),
    "supcon_loss": lambda a, b: supcon_loss(torch.cat([a, b]), torch.cat([LABELS, LABELS]),
                                            temperature=TAU),
    "contrastive_risk": lambda a, b: contrastive_risk(a, b, temperature=TAU),
    "contrastive_risk_masked": lambda a, b: contrastive_risk(a, b, temperature=TAU,
                                                             negatives_mask=MASK),
    "oce_kl": lambda a, b: oce_risk(_delta(a, b)[0], phi="kl", temperature=TAU,
                                    mask=_delta(a, b)[1]),
    "oce_cvar": lambda a, b: oce_risk(_delta(a, b)[0], phi="cvar", alpha=0.3,
                                      mask=_delta(a, b)[1]),
    "oce_softplus": lambda a, b: oce_risk(_delta(a, b)[0], phi="softplus",
                                          mask=_delta(a, b)[1]),
    **{f"pairwise_{name}": (lambda a, b, name=name: pairwise_risk(
        _delta(a, b)[0], loss=name, mask=_delta(a, b)[1]))
       for name in ("logistic", "squared_hinge", "hinge")},
    # The exponential surrogate exp(delta) of a score difference of 1e6 is not a float in any
    # precision (it is +inf by definition, and training stops on it with a clear error); it is
    # checked wherever exp(delta) is representable in test_exponential_pairwise_in_range.
    "relaxed_kmeans": lambda a, b: relaxed_kmeans(torch.cat([a, b]), 3),
    "gcl_fixed": _gcl("fixed"),
    "gcl_global_learnable": _gcl("global_learnable"),
    "gcl_per_sample": _gcl("per_sample"),
    "gcl_tiled": _gcl("fixed", block_size=3),
    "gcl_tiled_per_sample": _gcl("per_sample", block_size=3),
    "tiled_info_nce": lambda a, b: info_nce(a, b, temperature=TAU, symmetric=True,
                                            block_size=3),
    "tiled_info_nce_masked": lambda a, b: info_nce(a, b, temperature=TAU, negatives_mask=MASK,
                                                   block_size=3),
    "tiled_clip_loss": lambda a, b: clip_loss(a, b, 1 / TAU, block_size=3),
    "tiled_hard_negatives": lambda a, b: _hard_negatives(a, b, block_size=3),
    "hard_negatives": lambda a, b: _hard_negatives(a, b, block_size=None),
}


def _hard_negatives(a: Tensor, b: Tensor, block_size: int | None) -> Tensor:
    """InfoNCE with two extra (hard) candidates per anchor: other anchors' positives."""
    out = anchor_logsumexp(a, b, 1 / TAU, extra=torch.stack([b.roll(1, 0), b.roll(2, 0)], 1),
                           block_size=block_size)
    return (out.lse - out.positive).mean()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("max_norm", [1.0, 1e3], ids=["norm1", "norm1e3"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_finite_with_finite_gradients(name: str, max_norm: float,
                                           dtype: torch.dtype) -> None:
    for seed in range(3):
        a64, b64 = _embeddings(seed, max_norm)
        a = a64.to(dtype).requires_grad_(True)
        b = b64.to(dtype).requires_grad_(True)
        value = LOSSES[name](a, b)
        assert bool(torch.isfinite(value)), f"{name}: {float(value)}"
        grad_a, grad_b = torch.autograd.grad(value, [a, b], allow_unused=True)
        for grad in (grad_a, grad_b):
            if grad is not None:
                assert grad.dtype == dtype
                assert bool(torch.isfinite(grad).all()), f"{name}: non-finite gradient"


@pytest.mark.parametrize("inputs", ["float32", "tower"])
@pytest.mark.parametrize("max_norm", [1.0, 1e3], ids=["norm1", "norm1e3"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_finite_under_bf16_autocast(name: str, max_norm: float, inputs: str) -> None:
    """Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` at tau = 0.005: float32 embeddings
    given to the loss, or bfloat16 ones coming out of a linear tower run under autocast (as in
    bf16 training); the loss and the gradients of the float32 leaves are finite."""
    for seed in range(2):
        a64, b64 = _embeddings(seed, max_norm)
        a, b = a64.float().requires_grad_(True), b64.float().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if inputs == "tower":
                tower = torch.eye(D)
                za, zb = F.linear(a, tower), F.linear(b, tower)
                assert za.dtype == torch.bfloat16
            else:
                za, zb = a, b
            value = LOSSES[name](za, zb)
        assert bool(torch.isfinite(value)), f"{name}: {float(value.detach())}"
        grads = torch.autograd.grad(value, [a, b], allow_unused=True)
        for grad in grads:
            if grad is not None:
                assert grad.dtype == torch.float32
                assert bool(torch.isfinite(grad).all()), f"{name}: non-finite gradient"


def test_low_precision_matches_float32_on_the_same_values() -> None:
    """bfloat16 inputs are computed in float32: the same numbers give the same loss; the tiled
    kernel multiplies bfloat16 tiles in bfloat16 (float32 reductions): within 1e-2 there."""
    a64, b64 = _embeddings(0, 1e3)
    a16, b16 = a64.to(torch.bfloat16), b64.to(torch.bfloat16)
    for name, fn in LOSSES.items():
        if name.startswith(("gcl", "oce", "pairwise")) or name == "relaxed_kmeans":
            continue  # stateful, or the test computes delta in the input precision
        low = fn(a16, b16)
        assert low.dtype == torch.float32, name
        same = fn(a16.float(), b16.float())
        if name.startswith("tiled") or name == "hard_negatives":
            assert float(low) == pytest.approx(float(same), rel=1e-2), name
        else:
            assert torch.equal(low, same), name


def test_exponential_pairwise_in_range() -> None:
    """The exponential surrogate is finite (and exact) wherever exp(delta) is a float32."""
    a, b = _embeddings(0, 1.0)
    delta, mask = _delta(F.normalize(a, dim=1), F.normalize(b, dim=1))
    delta = 40.0 * delta  # |delta| <= 80 < log(float32 max) = 88.7
    for dtype in (torch.float32, torch.bfloat16):
        x = delta.to(dtype).requires_grad_(True)
        value = pairwise_risk(x, loss="exponential", mask=mask)
        (grad,) = torch.autograd.grad(value, [x])
        assert bool(torch.isfinite(value)) and bool(torch.isfinite(grad).all())
    expected = ref_pairwise_risk(delta, "exponential", mask=mask)
    assert float(pairwise_risk(delta, loss="exponential", mask=mask)) == pytest.approx(
        float(expected), rel=1e-12)


# ----------------------------------------------------------------------------- logit scales


def _aligned(seed: int) -> tuple[Tensor, Tensor]:
    """Unit embeddings whose positives score highest: the loss falls as the scale grows."""
    gen = torch.Generator().manual_seed(seed)
    a = F.normalize(torch.randn(B, D, generator=gen), dim=1)
    return a, F.normalize(a + 0.05 * torch.randn(B, D, generator=gen), dim=1)


@pytest.mark.parametrize("module", [ClipLoss, SigLipLoss], ids=["clip", "siglip"])
def test_learnable_logit_scale_stays_clamped(module: type[torch.nn.Module]) -> None:
    loss_fn = module()
    optimizer = torch.optim.SGD(loss_fn.parameters(), lr=1e3)
    a, b = _aligned(0)
    limit = math.log(100.0)
    pushed = False
    for _ in range(20):
        loss = loss_fn(a, b)
        assert float(loss_fn.logit_scale.detach()) <= limit + 1e-6  # what the forward pass used
        assert bool(torch.isfinite(loss))
        optimizer.zero_grad()
        loss.backward()
        assert float(loss_fn.logit_scale.grad) < 0  # the optimiser pushes the scale up
        optimizer.step()
        pushed |= float(loss_fn.logit_scale.detach()) > limit
    assert pushed  # the step did go past the limit; the next forward clamped it back
    loss_fn(a, b)
    assert float(loss_fn.logit_scale.detach()) == pytest.approx(limit)


def test_objective_logit_scale_stays_clamped_in_training() -> None:
    from crl.losses import build_objective
    from crl.negatives import NegativesConfig
    from crl.train import train_step
    from crl.train.config import LossConfig

    torch.manual_seed(0)
    towers = torch.nn.Identity()
    model = DualEncoder(towers, towers, normalize=True)
    objective = build_objective(LossConfig(name="clip"), NegativesConfig(), num_samples=B)
    scale = objective.loss.logit_scale
    optimizer = torch.optim.SGD(objective.parameters(), lr=1e3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    a, b = _aligned(1)
    batch = (a, b, torch.arange(B), torch.full((B,), -1))
    for step in range(10):
        loss, _ = train_step(model, objective, batch, optimizer, scheduler, grad_clip=None,
                             step=step, device=torch.device("cpu"))
        assert math.isfinite(loss)
        assert float(scale.detach().exp()) <= 100.0 * (1 + 1e-6)
    assert float(scale.detach()) == pytest.approx(math.log(100.0))


# ----------------------------------------------------------------------------- GCL state


@pytest.mark.parametrize("block_size", [None, 3], ids=["dense", "tiled"])
@pytest.mark.parametrize("mode", ["fixed", "global_learnable", "per_sample"])
def test_gcl_state_stays_finite_over_many_steps(mode: str, block_size: int | None) -> None:
    """At tau 0.005, batches alternate between tiny (norm 1e-3) and huge (norm 1e3) embeddings
    and hard negatives: log u never overflows or underflows, the loss and gradients stay finite,
    and g_hat / u <= 1 / gamma keeps the loss bounded."""
    n = 32
    loss_fn = GlobalContrastiveLoss(num_samples=n, temperature=TAU, gamma=0.9,
                                    temperature_mode=mode, block_size=block_size)
    gen = torch.Generator().manual_seed(0)
    for step in range(60):
        index = torch.randperm(n, generator=gen)[:B]
        radius = 1e-3 if step % 2 else 1e3
        a = F.normalize(torch.randn(B, D, generator=gen), dim=1) * radius
        b = a.roll(1, dims=0) if step % 3 == 0 else a + 0.1 * radius * torch.randn(
            B, D, generator=gen)
        a.requires_grad_(True)
        loss = loss_fn(a, b, index)
        (grad,) = torch.autograd.grad(loss, [a])
        assert bool(torch.isfinite(loss)) and bool(torch.isfinite(grad).all()), step
        for state in (loss_fn.log_u_a2b, loss_fn.log_u_b2a):
            visited = state[~torch.isnan(state)]
            assert bool(torch.isfinite(visited).all()), step
            assert state.dtype == torch.float64
        if mode == "fixed":
            assert float(loss.detach()) <= TAU / 0.9 * (1 + 1e-9)
    assert int((~torch.isnan(loss_fn.log_u_a2b)).sum()) > n // 2


# ----------------------------------------------------------------------------- fuzz


@st.composite
def _problem(draw: st.DrawFn) -> tuple[Tensor, Tensor, Tensor, float]:
    batch = draw(st.integers(2, 6))
    dim = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    log_scale = draw(st.floats(-3.0, 2.0))
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(batch, dim, generator=gen, dtype=torch.float64) * 10.0 ** log_scale
    b = torch.randn(batch, dim, generator=gen, dtype=torch.float64) * 10.0 ** log_scale
    mask = torch.rand(batch, batch, generator=gen) < draw(st.floats(0.2, 1.0))
    mask &= ~torch.eye(batch, dtype=torch.bool)
    for i in range(batch):  # every anchor keeps a negative
        if not bool(mask[i].any()):
            mask[i, (i + 1) % batch] = True
    temperature = 10.0 ** draw(st.floats(-2.0, 1.0))
    return a, b, mask, temperature


def _close(ours: Tensor, ref: Tensor, rtol: float = 1e-9) -> None:
    scale = max(1.0, abs(float(ref)))
    assert abs(float(ours) - float(ref)) <= rtol * scale, (float(ours), float(ref))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_problem(), st.booleans())
def test_fuzz_against_float64_references(problem: tuple[Tensor, Tensor, Tensor, float],
                                         symmetric: bool) -> None:
    a, b, mask, tau = problem
    _close(info_nce(a, b, temperature=tau, symmetric=symmetric, negatives_mask=mask),
           ref_info_nce(a, b, tau, symmetric=symmetric, negatives_mask=mask))
    _close(contrastive_risk(a, b, temperature=tau, negatives_mask=mask),
           ref_contrastive_risk(a, b, tau, negatives_mask=mask))
    _close(clip_loss(a, b, 1 / tau), ref_clip_loss(a, b, 1 / tau))
    scores = a @ b.T
    delta = scores - scores.diagonal().unsqueeze(1)
    _close(oce_risk(delta, phi="kl", temperature=tau, mask=mask),
           ref_oce_kl(delta, tau, mask=mask))
    _close(oce_risk(delta, phi="cvar", alpha=0.4, mask=mask), ref_oce_cvar(delta, 0.4, mask=mask))
    _close(oce_risk(delta, phi="softplus", mask=mask), ref_oce_softplus(delta, mask=mask),
           rtol=1e-7)
    for name in ("logistic", "squared_hinge", "hinge"):
        _close(pairwise_risk(delta, loss=name, mask=mask),
               ref_pairwise_risk(delta, name, mask=mask))
    if float(delta.abs().max()) < 80:
        _close(pairwise_risk(delta, loss="exponential", mask=mask),
               ref_pairwise_risk(delta, "exponential", mask=mask))
    # The same problem in float32: finite, and close to float64 relative to the logits' size.
    logits = float((scores / tau).abs().max())
    value32 = info_nce(a.float(), b.float(), temperature=tau, symmetric=symmetric,
                       negatives_mask=mask)
    assert bool(torch.isfinite(value32))
    reference = ref_info_nce(a, b, tau, symmetric=symmetric, negatives_mask=mask)
    assert abs(float(value32) - float(reference)) <= 1e-5 * (1 + logits)
