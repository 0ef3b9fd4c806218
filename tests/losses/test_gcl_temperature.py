"""The learnable-temperature variants of GCL (FastCLIP-v3 global tau, iSogCLR per-sample tau)
against their gradients written out by hand (docs/theory.md §10)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from crl.errors import CrlValueError
from crl.losses import GlobalContrastiveLoss
from crl.losses._gcl_temperature import (
    TEMPERATURE_MODES,
    FixedTemperature,
    GlobalTemperature,
    PerSampleTemperature,
    temperature_strategy,
)


def embeddings(b: int, d: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    p = F.normalize(a + 0.6 * torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    return a.requires_grad_(), p.requires_grad_()


def written_terms(x: Tensor, y: Tensor, mask: Tensor, taus: list[float],
                  log_u: list[float], rho: float) -> tuple[list[float], list[float], Tensor]:
    """Per anchor with a negative: the value ``tau (log u + rho)``, the tau-gradient
    ``log u + rho + tau g_hat'(tau) / u`` with ``g_hat' = mean_j exp(D/tau) (-D / tau^2)``,
    and the model surrogate ``sum_i tau g_hat_i / u_i`` (tau held constant) for autograd."""
    values, tau_grads, surrogate = [], [], torch.zeros((), dtype=torch.float64)
    for i in range(x.shape[0]):
        negs = [j for j in range(y.shape[0]) if j != i and bool(mask[i, j])]
        if not negs:
            continue
        tau, u = taus[i], math.exp(log_u[i])
        diffs = [x[i] @ y[j] - x[i] @ y[i] for j in negs]
        g_hat = sum(torch.exp(d / tau) for d in diffs) / len(negs)
        dg = sum(float((torch.exp(d / tau) * (-d / tau**2)).detach()) for d in diffs) / len(negs)
        values.append(tau * (log_u[i] + rho))
        tau_grads.append(log_u[i] + rho + tau * dg / u)
        surrogate = surrogate + tau * g_hat / u  # type: ignore[assignment]
    return values, tau_grads, surrogate


@pytest.mark.parametrize("symmetric", [False, True])
def test_global_learnable_temperature_gradients(symmetric: bool) -> None:
    n, b_size, rho = 10, 6, 2.5
    loss = GlobalContrastiveLoss(n, temperature=0.2, gamma=0.7, symmetric=symmetric,
                                 temperature_mode="global_learnable", rho=rho)
    index = torch.tensor([0, 2, 3, 5, 7, 9])
    loss(*embeddings(b_size, 4, seed=0), index)  # warm the state
    a, b = embeddings(b_size, 4, seed=1)
    mask = torch.rand(b_size, b_size, generator=torch.Generator().manual_seed(3)) < 0.6
    mask[4] = False
    value = loss(a, b, index, mask)
    grad_a, grad_b, grad_tau = torch.autograd.grad(value, (a, b, loss.temperature))

    tau = float(loss.temperature.detach())
    dirs = [(a, b, loss.log_u_a2b), (b, a, loss.log_u_b2a)][: 2 if symmetric else 1]
    want_value, want_tau, surrogate = 0.0, 0.0, torch.zeros((), dtype=torch.float64)
    for x, y, state in dirs:
        log_u = [float(state[i]) for i in index]
        vals, tgrads, sur = written_terms(x, y, mask, [tau] * b_size, log_u, rho)
        want_value += sum(vals) / len(vals) / len(dirs)
        want_tau += sum(tgrads) / len(tgrads) / len(dirs)
        surrogate = surrogate + sur / len(vals) / len(dirs)
    want_a, want_b = torch.autograd.grad(surrogate, (a, b))
    assert float(value.detach()) == pytest.approx(want_value, rel=1e-6)
    assert float(grad_tau) == pytest.approx(want_tau, rel=1e-5, abs=1e-6)
    assert torch.allclose(grad_a, want_a, rtol=1e-9, atol=1e-12)
    assert torch.allclose(grad_b, want_b, rtol=1e-9, atol=1e-12)


def test_per_sample_temperature_gradients() -> None:
    n, b_size, rho = 12, 5, 1.0
    loss = GlobalContrastiveLoss(n, temperature=0.3, gamma=0.5, temperature_mode="per_sample",
                                 rho=rho)
    assert loss.temperature.shape == (2, n)
    with torch.no_grad():  # distinct temperatures per sample and direction
        spread = torch.rand(2, n, generator=torch.Generator().manual_seed(0))
        loss.temperature.copy_(0.1 + 0.05 * spread)
    index = torch.tensor([11, 4, 0, 6, 8])
    loss(*embeddings(b_size, 3, seed=2), index)
    a, b = embeddings(b_size, 3, seed=3)
    value = loss(a, b, index)
    grad_a, grad_b, grad_tau = torch.autograd.grad(value, (a, b, loss.temperature))

    full = ~torch.eye(b_size, dtype=torch.bool)
    want_tau = torch.zeros(2, n, dtype=torch.float64)
    surrogate = torch.zeros((), dtype=torch.float64)
    want_value = 0.0
    for row, (x, y, state) in enumerate(((a, b, loss.log_u_a2b), (b, a, loss.log_u_b2a))):
        taus = [float(loss.temperature[row, i].detach()) for i in index]
        log_u = [float(state[i]) for i in index]
        vals, tgrads, sur = written_terms(x, y, full, taus, log_u, rho)
        want_value += 0.5 * sum(vals) / b_size
        surrogate = surrogate + 0.5 * sur / b_size
        for r, i in enumerate(index.tolist()):
            want_tau[row, i] = 0.5 * tgrads[r] / b_size
    want_a, want_b = torch.autograd.grad(surrogate, (a, b))
    assert float(value.detach()) == pytest.approx(want_value, rel=1e-6)
    assert torch.allclose(grad_tau.double(), want_tau, rtol=1e-5, atol=1e-7)
    assert torch.allclose(grad_a, want_a, rtol=1e-9, atol=1e-12)
    assert torch.allclose(grad_b, want_b, rtol=1e-9, atol=1e-12)


def test_learnable_temperature_is_clamped_and_trains_downhill() -> None:
    n = 32
    loss = GlobalContrastiveLoss(n, temperature=0.5, temperature_mode="global_learnable",
                                 rho=0.5, min_temperature=0.05)
    with torch.no_grad():
        loss.temperature.fill_(0.01)
    a, b = embeddings(8, 4, seed=4)
    loss(a, b, torch.arange(8))
    assert float(loss.temperature.detach()) == pytest.approx(0.05)
    # gradient descent on tau lowers the objective tau (log g + rho) evaluated exactly
    loss = GlobalContrastiveLoss(n, temperature=0.5, temperature_mode="global_learnable", rho=0.5,
                                 gamma=1.0)
    a, b = embeddings(n, 4, seed=5)
    a, b = a.detach(), b.detach()
    opt = torch.optim.SGD([loss.temperature], lr=0.05)

    def objective(tau: float) -> float:
        s = a @ b.T
        d = (s - s.diagonal().unsqueeze(1)) / tau
        d = d.masked_fill(torch.eye(n, dtype=torch.bool), -math.inf)
        return float((tau * (torch.logsumexp(d, dim=1) - math.log(n - 1) + 0.5)).mean())

    start = objective(float(loss.temperature.detach()))
    for _ in range(20):
        opt.zero_grad()
        loss(a, b, torch.arange(n)).backward()
        opt.step()
    assert objective(float(loss.temperature.detach())) < start - 1e-3


@pytest.mark.parametrize(("mode", "strategy", "shape"), [
    ("fixed", FixedTemperature, ()), ("global_learnable", GlobalTemperature, ()),
    ("per_sample", PerSampleTemperature, (2, 7))])
def test_each_mode_is_one_strategy_chosen_at_construction(mode: str, strategy: type,
                                                          shape: tuple[int, ...]) -> None:
    """The mode picks its strategy once; the state dict keeps its keys (``temperature`` a
    float64 buffer when fixed, a parameter when learned)."""
    loss = GlobalContrastiveLoss(7, temperature=0.2, temperature_mode=mode)  # type: ignore[arg-type]
    assert type(loss.temperature_strategy) is strategy and loss.temperature_mode == mode
    assert list(loss.state_dict()) == (["temperature", "log_u_a2b", "log_u_b2a", "epoch"]
                                       if mode != "fixed" else
                                       ["log_u_a2b", "log_u_b2a", "epoch", "temperature"])
    assert tuple(loss.temperature.shape) == shape
    assert isinstance(loss.temperature, torch.nn.Parameter) == (mode != "fixed")
    assert loss.temperature.dtype == (torch.float64 if mode == "fixed" else torch.float32)
    assert TEMPERATURE_MODES[mode] is strategy
    with pytest.raises(CrlValueError, match="valid values are 'fixed', 'global_learnable', "
                                            "'per_sample'"):
        temperature_strategy("f", "learned", rho=1.0, min_temperature=0.1)


def test_the_strategies_surrogates_and_clamps() -> None:
    ratio = torch.tensor([0.5, 2.0], requires_grad=True)
    log_u, tau = torch.tensor([-1.0, 0.25]), torch.tensor(0.3)
    fixed = temperature_strategy("f", "fixed", rho=2.0, min_temperature=0.1)
    assert torch.equal(fixed.surrogate(tau, ratio, log_u), tau * ratio)
    learned = temperature_strategy("f", "per_sample", rho=2.0, min_temperature=0.1)
    value = learned.surrogate(tau, ratio, log_u)  # value tau (log u + rho), gradient tau
    assert torch.allclose(value, tau * (log_u + 2.0))
    (grad,) = torch.autograd.grad(value.sum(), ratio)
    assert torch.equal(grad, torch.full((2,), 0.3))
    temperature = torch.nn.Parameter(torch.tensor([[0.2, 0.5], [0.3, 0.4]]))
    version = temperature._version
    learned.clamp_if_below_(temperature)  # in range: not written (its version unchanged)
    assert temperature._version == version
    with torch.no_grad():
        temperature[0, 0] = 0.01
    learned.clamp_if_below_(temperature)
    assert float(temperature[0, 0].detach()) == pytest.approx(0.1)
    assert learned.risk_temperature(temperature) == pytest.approx(0.325)
    with pytest.raises(CrlValueError, match=r"min_temperature = 0\.5 for a learnable"):
        GlobalContrastiveLoss(5, temperature=0.2, temperature_mode="global_learnable",
                              min_temperature=0.5)
