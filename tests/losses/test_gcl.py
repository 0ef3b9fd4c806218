"""GlobalContrastiveLoss against the formulas of docs/theory.md §10, written as float64 loops."""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from crl.errors import CrlTypeError, CrlValueError
from crl.losses import GlobalContrastiveLoss, contrastive_risk
from crl.losses.gcl import cosine_gamma
from crl.negatives import NegativeSets


def embeddings(b: int, d: int, seed: int,
               dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = F.normalize(torch.randn(b, d, generator=g, dtype=dtype), dim=1)
    p = F.normalize(a + 0.5 * torch.randn(b, d, generator=g, dtype=dtype), dim=1)
    return a.requires_grad_(), p.requires_grad_()


def g_hat_loop(anchors: Tensor, cands: Tensor, mask: Tensor,
               tau: float | Tensor) -> list[Tensor | None]:
    """``g_hat_i = mean_{j in N_i} exp((s_ij - s_ii) / tau)`` by loops; None for empty rows."""
    out: list[Tensor | None] = []
    for i in range(anchors.shape[0]):
        t = tau[i] if isinstance(tau, Tensor) and tau.dim() == 1 else tau
        terms = [torch.exp((anchors[i] @ cands[j] - anchors[i] @ cands[i]) / t)
                 for j in range(cands.shape[0]) if j != i and bool(mask[i, j])]
        out.append(sum(terms) / len(terms) if terms else None)  # type: ignore[arg-type]
    return out


def random_mask(b: int, seed: int, p: float = 0.5) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, b, generator=g) < p


# --- state: first visit and the update rule --------------------------------------------------


def test_first_visit_sets_log_u_to_log_g_hat() -> None:
    a, b = embeddings(6, 4, seed=0)
    index = torch.tensor([9, 2, 5, 0, 7, 3])
    loss = GlobalContrastiveLoss(12, temperature=0.1, gamma=0.9)
    loss(a, b, index)
    for direction, (x, y), state in ((0, (a, b), loss.log_u_a2b), (1, (b, a), loss.log_u_b2a)):
        ref = g_hat_loop(x.detach(), y.detach(), ~torch.eye(6, dtype=torch.bool), 0.1)
        for r, i in enumerate(index.tolist()):
            assert ref[r] is not None
            want = math.log(float(ref[r]))  # type: ignore[arg-type]
            assert math.isclose(float(state[i]), want, rel_tol=0, abs_tol=1e-12), direction
    unvisited = torch.ones(12, dtype=torch.bool)
    unvisited[index] = False
    assert torch.isnan(loss.log_u_a2b[unvisited]).all()
    assert torch.isnan(loss.log_u_b2a[unvisited]).all()


def test_first_visit_is_exact_with_one_negative() -> None:
    # One negative per anchor: log g_hat_i is (s_ij - s_ii) / tau with no rounding in between.
    a, b = embeddings(4, 3, seed=1)
    mask = torch.tensor([[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0]], dtype=torch.bool)
    loss = GlobalContrastiveLoss(4, temperature=0.05, symmetric=False)
    loss(a, b, torch.arange(4), mask)
    s = (a @ b.T).detach()
    for i, j in ((0, 1), (1, 2), (2, 3), (3, 0)):
        assert float(loss.log_u_a2b[i]) == float((s[i, j] - s[i, i]) / 0.05)


@pytest.mark.parametrize("gamma", [0.9, 0.3, 1.0])
def test_second_call_follows_the_update_rule(gamma: float) -> None:
    loss = GlobalContrastiveLoss(10, temperature=0.2, gamma=gamma)
    a1, b1 = embeddings(5, 4, seed=2)
    i1 = torch.tensor([0, 1, 2, 3, 4])
    loss(a1, b1, i1)
    u_old = loss.log_u_a2b.clone().exp()
    a2, b2 = embeddings(5, 4, seed=3)
    i2 = torch.tensor([3, 4, 5, 6, 0])  # 3, 4, 0 revisited; 5, 6 first visits
    loss(a2, b2, i2)
    ref = g_hat_loop(a2.detach(), b2.detach(), ~torch.eye(5, dtype=torch.bool), 0.2)
    for r, i in enumerate(i2.tolist()):
        g_hat = float(ref[r])  # type: ignore[arg-type]
        expected = g_hat if i in (5, 6) else (1 - gamma) * float(u_old[i]) + gamma * g_hat
        assert math.isclose(float(loss.log_u_a2b[i].exp()), expected, rel_tol=1e-10)
    assert math.isclose(float(loss.log_u_a2b[1].exp()), float(u_old[1]), rel_tol=0)  # untouched


def test_non_finite_state_is_reset_to_g_hat() -> None:
    loss = GlobalContrastiveLoss(3, temperature=0.5, gamma=0.5, symmetric=False)
    loss.log_u_a2b.copy_(torch.tensor([math.inf, -math.inf, math.nan], dtype=torch.float64))
    a, b = embeddings(3, 2, seed=4)
    loss(a, b, torch.arange(3))
    ref = g_hat_loop(a.detach(), b.detach(), ~torch.eye(3, dtype=torch.bool), 0.5)
    for i in range(3):
        assert math.isclose(float(loss.log_u_a2b[i]), math.log(float(ref[i])), abs_tol=1e-12)  # type: ignore[arg-type]


# --- the loss and its gradient ---------------------------------------------------------------


@pytest.mark.parametrize("symmetric", [False, True])
def test_gradient_equals_autograd_of_the_written_formula(symmetric: bool) -> None:
    b_size, n = 7, 20
    loss = GlobalContrastiveLoss(n, temperature=0.1, gamma=0.6, symmetric=symmetric)
    warm_a, warm_b = embeddings(b_size, 5, seed=5)
    index = torch.tensor([1, 4, 6, 8, 11, 15, 19])
    loss(warm_a, warm_b, index)  # so the checked call mixes old u and new g_hat
    a, b = embeddings(b_size, 5, seed=6)
    mask = random_mask(b_size, seed=0)
    mask[2] = False  # anchor 2 has no negative: skipped, u unchanged
    before = (loss.log_u_a2b.clone(), loss.log_u_b2a.clone())
    value = loss(a, b, index, mask)
    got = torch.autograd.grad(value, (a, b))

    # tau * mean_i g_hat_i / u_i over anchors with a negative, u read back from the state
    terms = []
    for x, y, state in ((a, b, loss.log_u_a2b), (b, a, loss.log_u_b2a))[: 2 if symmetric else 1]:
        g_hat = g_hat_loop(x, y, mask, 0.1)
        per = [0.1 * g / float(state[index[r]].exp()) for r, g in enumerate(g_hat) if g is not None]
        terms.append(sum(per) / len(per))
    reference = sum(terms) / len(terms)
    want = torch.autograd.grad(reference, (a, b))  # type: ignore[arg-type]
    assert torch.allclose(value, reference.detach(), rtol=1e-12)  # type: ignore[union-attr]
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, rtol=1e-10, atol=1e-13)
    for state, old in ((loss.log_u_a2b, before[0]), (loss.log_u_b2a, before[1])):
        assert torch.equal(state[index[2]].nan_to_num(), old[index[2]].nan_to_num())
    assert bool(torch.isfinite(loss.log_u_b2a[index[2]])) == symmetric


@pytest.mark.parametrize("regime", ["in_batch", "shared", "independent"])
def test_whole_dataset_with_gamma_one_is_the_contrastive_risk_gradient(regime: str) -> None:
    n = 24
    a, b = embeddings(n, 6, seed=7)
    index = torch.arange(n)
    mask = (None if regime == "in_batch"
            else NegativeSets(n, 9, regime=regime, seed=1).batch_mask(index))  # type: ignore[arg-type]
    one_way = GlobalContrastiveLoss(n, temperature=0.07, gamma=1.0, symmetric=False)
    got = torch.autograd.grad(one_way(a, b, index, mask), (a, b))
    risk = contrastive_risk(a, b, temperature=0.07, negatives_mask=mask)
    want = torch.autograd.grad(risk, (a, b))
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, rtol=1e-10, atol=1e-12)
    both = GlobalContrastiveLoss(n, temperature=0.07, gamma=1.0, symmetric=True)
    got = torch.autograd.grad(both(a, b, index, mask), (a, b))
    # b -> a uses the same sample-indexed mask: b[i]'s negatives are the a[j] with mask[i, j]
    risk = 0.5 * (contrastive_risk(a, b, temperature=0.07, negatives_mask=mask)
                  + contrastive_risk(b, a, temperature=0.07, negatives_mask=mask))
    want = torch.autograd.grad(risk, (a, b))
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, rtol=1e-10, atol=1e-12)


def test_anchors_without_negatives_are_skipped() -> None:
    a, b = embeddings(4, 3, seed=8)
    loss = GlobalContrastiveLoss(4, temperature=0.3, symmetric=False)
    none = torch.zeros(4, 4, dtype=torch.bool)
    value = loss(a, b, torch.arange(4), none)
    assert float(value.detach()) == 0.0
    grads = torch.autograd.grad(value, (a, b))
    assert all(float(g.abs().sum()) == 0.0 for g in grads)
    assert torch.isnan(loss.log_u_a2b).all()
    one = none.clone()
    one[1, 3] = True
    value = loss(a, b, torch.arange(4), one)
    assert float(value.detach()) == pytest.approx(0.3)  # one anchor, first visit: tau * 1
    assert torch.isfinite(loss.log_u_a2b).tolist() == [False, True, False, False]


@pytest.mark.parametrize("mode", ["fixed", "global_learnable", "per_sample"])
def test_stable_at_tiny_temperature(mode: str) -> None:
    n, b_size = 64, 16
    loss = GlobalContrastiveLoss(n, temperature=0.005, gamma=0.5,
                                 temperature_mode=mode,  # type: ignore[arg-type]
                                 min_temperature=0.001)
    gen = torch.Generator().manual_seed(0)
    weights = torch.randn(8, 8, generator=gen, requires_grad=True)
    x = torch.randn(n, 8, generator=gen)
    sets = NegativeSets(n, 6, regime="independent")
    for step in range(8):
        index = torch.randperm(n, generator=gen)[:b_size]
        a = F.normalize(x[index] @ weights, dim=1)
        noise = 0.1 * step * torch.randn(b_size, 8, generator=gen)
        p = F.normalize((x[index] + noise) @ weights, dim=1)
        mask = sets.batch_mask(index) if step % 2 else None
        value = loss(a, p, index, mask)
        params = [weights] + ([loss.temperature] if mode != "fixed" else [])
        grads = torch.autograd.grad(value, params)
        assert torch.isfinite(value)
        assert all(bool(torch.isfinite(g).all()) for g in grads)
        visited = torch.isfinite(loss.log_u_a2b)
        active = index if mask is None else index[mask.any(1)]
        assert not torch.isnan(loss.log_u_a2b[active]).any()
        assert not (loss.log_u_a2b[visited].abs() == math.inf).any()
        # the ratio g_hat / u never exceeds 1 / gamma
        if mode == "fixed":
            assert float(value.detach()) <= 0.005 / 0.5 + 1e-9


# --- schedule, state_dict, input checks -------------------------------------------------------


def test_cosine_gamma_schedule_drives_the_update() -> None:
    loss = GlobalContrastiveLoss(5, gamma_schedule="cosine", gamma_min=0.2, decay_epochs=4)
    expected = [0.5 * (1 + math.cos(math.pi * e / 4)) * 0.8 + 0.2 for e in range(4)] + [0.2, 0.2]
    for e, want in enumerate(expected):
        loss.set_epoch(e)
        assert loss.current_gamma == pytest.approx(want)
        assert cosine_gamma(e, 4, 0.2) == pytest.approx(want)
    assert GlobalContrastiveLoss(5, gamma=0.7).current_gamma == 0.7
    loss.set_epoch(2)  # gamma = 0.6
    a, b = embeddings(3, 2, seed=9)
    loss(a, b, torch.tensor([0, 1, 2]))
    u1 = loss.log_u_a2b[:3].exp().clone()
    a2, b2 = embeddings(3, 2, seed=10)
    loss(a2, b2, torch.tensor([0, 1, 2]))
    g = g_hat_loop(a2.detach(), b2.detach(), ~torch.eye(3, dtype=torch.bool), 0.07)
    for i in range(3):
        want = 0.4 * float(u1[i]) + 0.6 * float(g[i])  # type: ignore[arg-type]
        assert math.isclose(float(loss.log_u_a2b[i].exp()), want, rel_tol=1e-10)


def test_state_dict_round_trip_resumes_exactly() -> None:
    loss = GlobalContrastiveLoss(10, temperature=0.1, temperature_mode="per_sample",
                                 gamma_schedule="cosine", decay_epochs=3)
    loss.set_epoch(1)
    a, b = embeddings(4, 3, seed=11)
    loss(a, b, torch.tensor([1, 3, 5, 7]))
    buffer = io.BytesIO()
    torch.save(loss.state_dict(), buffer)
    buffer.seek(0)
    resumed = GlobalContrastiveLoss(10, temperature=0.1, temperature_mode="per_sample",
                                    gamma_schedule="cosine", decay_epochs=3)
    resumed.load_state_dict(torch.load(buffer))
    assert int(resumed.epoch) == 1
    for name in ("log_u_a2b", "log_u_b2a"):
        assert torch.equal(getattr(resumed, name).isnan(), getattr(loss, name).isnan())
        assert torch.equal(getattr(resumed, name).nan_to_num(), getattr(loss, name).nan_to_num())
    a2, b2 = embeddings(4, 3, seed=12)
    idx = torch.tensor([3, 5, 8, 9])
    assert float(loss(a2, b2, idx).detach()) == float(resumed(a2, b2, idx).detach())
    assert torch.equal(loss.log_u_a2b.nan_to_num(), resumed.log_u_a2b.nan_to_num())


def test_bad_input_is_rejected_with_names() -> None:
    loss = GlobalContrastiveLoss(5)
    a, b = embeddings(3, 2, seed=13)
    with pytest.raises(CrlValueError, match="index"):
        loss(a, b, torch.tensor([0, 0, 1]))
    with pytest.raises(CrlValueError, match="index"):
        loss(a, b, torch.tensor([0, 1, 5]))
    with pytest.raises(CrlValueError, match="index"):
        loss(a, b, torch.tensor([0, 1]))
    with pytest.raises(CrlTypeError, match="index"):
        loss(a, b, torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(CrlValueError, match="negatives_mask"):
        loss(a, b, torch.arange(3), torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(CrlValueError, match="decay_epochs"):
        GlobalContrastiveLoss(5, gamma_schedule="cosine")
    with pytest.raises(CrlValueError, match="gamma"):
        GlobalContrastiveLoss(5, gamma=1.5)
    with pytest.raises(CrlValueError, match="temperature_mode"):
        GlobalContrastiveLoss(5, temperature_mode="learnable")  # type: ignore[arg-type]
    with pytest.raises(CrlValueError, match="temperature"):
        GlobalContrastiveLoss(5, temperature=-1.0)
