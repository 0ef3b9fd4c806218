"""Lazy AdamW (crl.train.lazy_adamw): torch's AdamW where every row is in every gradient, rows
absent from a gradient untouched bit for bit, and a row-by-row reference written from the
formula (docs/training.md, section "Sparse embedding gradients")."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crl.errors import CrlValueError
from crl.train.lazy_adamw import LazyAdamW

HYPER = {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def _sparse(rows: torch.Tensor, values: torch.Tensor, num_rows: int) -> torch.Tensor:
    """A sparse COO gradient ``(num_rows, d)`` with (possibly repeated, unordered) rows."""
    return torch.sparse_coo_tensor(rows.reshape(1, -1), values, (num_rows, values.shape[1]),
                                   check_invariants=True)


def _run(optimizer_cls, grads: list[torch.Tensor], start: torch.Tensor, **kwargs):
    param = torch.nn.Parameter(start.clone())
    opt = optimizer_cls([param], **kwargs)
    for g in grads:
        param.grad = g
        opt.step()
    return param.detach(), opt.state[param]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_row_in_every_gradient_is_adamw(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(40, 6, generator=gen, dtype=dtype)
    dense = [torch.randn(40, 6, generator=gen, dtype=dtype) for _ in range(6)]
    # the same gradients, sparse: rows shuffled and each split in two repeated entries
    sparse = []
    for g in dense:
        order = torch.randperm(40, generator=gen)
        part = torch.rand(40, 1, generator=gen, dtype=dtype)
        sparse.append(_sparse(torch.cat([order, order]),
                              torch.cat([g[order] * part, g[order] * (1 - part)]), 40))
    want, want_state = _run(torch.optim.AdamW, dense, start, foreach=False, **HYPER)
    exact, _ = _run(LazyAdamW, [g.to_sparse(1) for g in dense], start, **HYPER)
    assert torch.equal(exact, want)  # the same operations in the same order as AdamW's
    got, state = _run(LazyAdamW, sparse, start, **HYPER)  # repeated rows: summed first
    tol = {"rtol": 0, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 0, "atol": 1e-12}
    torch.testing.assert_close(got, want, **tol)
    for key in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(state[key], want_state[key], **tol)
    assert float(state["step"]) == float(want_state["step"]) == 6
    assert not torch.equal(got, start)


def test_dense_gradients_are_torch_adamw_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(1)
    starts = [torch.randn(30, 4, generator=gen), torch.randn(4, generator=gen)]
    grads = [[torch.randn_like(s) for s in starts] for _ in range(5)]

    def run(cls, **kwargs):
        params = [torch.nn.Parameter(s.clone()) for s in starts]
        opt = cls(params, **HYPER, **kwargs)
        for step in grads:
            for p, g in zip(params, step, strict=True):
                p.grad = g.clone()
            opt.step()
        return [p.detach() for p in params]

    for got, want in zip(run(LazyAdamW), run(torch.optim.AdamW, foreach=False), strict=True):
        assert torch.equal(got, want)


def test_rows_absent_from_a_gradient_are_untouched_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(2)
    param = torch.nn.Parameter(torch.randn(50, 3, generator=gen))
    opt = LazyAdamW([param], **HYPER)
    for _ in range(8):
        rows = torch.randint(0, 50, (12,), generator=gen)
        param.grad = _sparse(rows, torch.randn(12, 3, generator=gen), 50)
        before = [param.detach().clone()] + [opt.state[param][k].clone()
                                             for k in ("exp_avg", "exp_avg_sq")
                                             if opt.state[param]]
        opt.step()
        absent = torch.ones(50, dtype=torch.bool)
        absent[rows] = False
        after = [param.detach()] + [opt.state[param][k] for k in ("exp_avg", "exp_avg_sq")]
        for old, new in zip(before, after, strict=False):
            assert torch.equal(old[absent], new[absent])
        assert not torch.equal(before[0][~absent], param.detach()[~absent])  # present: moved


def _reference(start: torch.Tensor, steps: list[tuple[list[int], torch.Tensor]], *, lr: float,
               betas: tuple[float, float], eps: float, weight_decay: float) -> list[torch.Tensor]:
    """Lazy AdamW row by row, from the formula: repeated rows summed, each present row decayed
    and moved with the moments' global-step bias correction; the other rows left alone."""
    beta1, beta2 = betas
    theta = [row.clone() for row in start]
    m = [torch.zeros_like(row) for row in start]
    v = [torch.zeros_like(row) for row in start]
    for t, (rows, values) in enumerate(steps, start=1):
        grad: dict[int, torch.Tensor] = {}
        for r, g in zip(rows, values, strict=True):
            grad[r] = grad[r] + g if r in grad else g.clone()
        for r, g in grad.items():
            theta[r] = theta[r] * (1 - lr * weight_decay)
            m[r] = beta1 * m[r] + (1 - beta1) * g
            v[r] = beta2 * v[r] + (1 - beta2) * g * g
            m_hat = m[r] / (1 - beta1**t)
            v_hat = v[r] / (1 - beta2**t)
            theta[r] = theta[r] - lr * m_hat / (torch.sqrt(v_hat) + eps)
    return [torch.stack(theta), torch.stack(m), torch.stack(v)]


@settings(max_examples=40, deadline=None)
@given(num_rows=st.integers(1, 12), dim=st.integers(1, 4), num_steps=st.integers(1, 5),
       seed=st.integers(0, 2**31 - 1), lr=st.floats(1e-4, 0.5), weight_decay=st.floats(0, 0.5),
       beta1=st.floats(0.0, 0.95), beta2=st.floats(0.5, 0.999))
def test_vectorised_update_equals_the_row_by_row_reference(
        num_rows: int, dim: int, num_steps: int, seed: int, lr: float, weight_decay: float,
        beta1: float, beta2: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    start = torch.randn(num_rows, dim, generator=gen, dtype=torch.float64)
    steps = []
    for _ in range(num_steps):
        k = int(torch.randint(1, 2 * num_rows + 1, (1,), generator=gen))  # repeats likely
        rows = torch.randint(0, num_rows, (k,), generator=gen)
        steps.append((rows.tolist(), torch.randn(k, dim, generator=gen, dtype=torch.float64)))
    hyper = {"lr": lr, "betas": (beta1, beta2), "eps": 1e-8, "weight_decay": weight_decay}
    got, state = _run(LazyAdamW, [_sparse(torch.tensor(r), g, num_rows) for r, g in steps],
                      start, **hyper)
    want = _reference(start, steps, **hyper)
    for a, b in zip([got, state["exp_avg"], state["exp_avg_sq"]], want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_state_dict_round_trip_continues_as_one_run() -> None:
    gen = torch.Generator().manual_seed(3)
    start = torch.randn(20, 2, generator=gen)
    grads = [_sparse(torch.randint(0, 20, (7,), generator=gen),
                     torch.randn(7, 2, generator=gen), 20) for _ in range(6)]
    whole, _ = _run(LazyAdamW, grads, start, **HYPER)
    param = torch.nn.Parameter(start.clone())
    opt = LazyAdamW([param], **HYPER)
    for g in grads[:3]:
        param.grad = g
        opt.step()
    saved = opt.state_dict()
    assert set(saved["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}  # AdamW's keys only
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    param2 = torch.nn.Parameter(param.detach().clone())
    opt2 = LazyAdamW([param2], **HYPER)
    opt2.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    for g in grads[3:]:
        param2.grad = g
        opt2.step()
    assert torch.equal(param2.detach(), whole)
    adamw = torch.optim.AdamW([torch.nn.Parameter(param.detach().clone())], lr=HYPER["lr"])
    adamw.load_state_dict(saved)  # the same layout as torch's AdamW
    assert torch.equal(adamw.state_dict()["state"][0]["exp_avg_sq"],
                       saved["state"][0]["exp_avg_sq"])


def test_bad_hyperparameters_and_gradients_are_refused() -> None:
    with pytest.raises(CrlValueError, match="betas"):
        LazyAdamW([torch.nn.Parameter(torch.zeros(2))], betas=(0.9, 1.0))
    param = torch.nn.Parameter(torch.zeros(3, 3))
    opt = LazyAdamW([param])
    param.grad = torch.eye(3).to_sparse(2)  # sparse in both dimensions: not a table's
    with pytest.raises(CrlValueError, match="sparse_dim=2"):
        opt.step()


def test_stepping_together_equals_each_optimiser_alone_bit_for_bit() -> None:
    # a group's optimisers (crl.train.lazy_adamw.step_together): the dense parameters of those
    # that share hyperparameters in one call, sparse rows and other optimisers on their own
    from crl.train.lazy_adamw import step_together

    def build(seed: int) -> list[tuple[list[torch.nn.Parameter], torch.optim.Optimizer]]:
        gen = torch.Generator().manual_seed(seed)
        out = []
        for k, make in enumerate([lambda ps: LazyAdamW(ps, **HYPER),
                                  lambda ps: LazyAdamW(ps, **HYPER),
                                  lambda ps: LazyAdamW(ps, **{**HYPER, "lr": 0.01}),
                                  lambda ps: torch.optim.SGD(ps, lr=0.1)]):
            params = [torch.nn.Parameter(torch.randn(30, 4, generator=gen)),
                      torch.nn.Parameter(torch.randn(5, generator=gen)),
                      torch.nn.Parameter(torch.randn(3, 2, generator=gen))]
            out.append((params, make(params if k < 3 else params[1:])))
        return out

    def grads(step: int, params: list[torch.nn.Parameter], k: int) -> None:
        gen = torch.Generator().manual_seed(100 * step + k)
        rows = torch.randint(0, 30, (7,), generator=gen)
        if k < 3:
            params[0].grad = _sparse(rows, torch.randn(7, 4, generator=gen), 30)
        params[1].grad = torch.randn(5, generator=gen)
        params[2].grad = None if step == 1 and k == 1 else torch.randn(3, 2, generator=gen)

    alone, together = build(0), build(0)
    for step in range(4):
        for k, (params, opt) in enumerate(alone):
            grads(step, params, k)
            opt.step()
        for k, (params, _) in enumerate(together):
            grads(step, params, k)
        step_together([opt for _, opt in together])
    for (a, opt_a), (b, opt_b) in zip(alone, together, strict=True):
        for pa, pb in zip(a, b, strict=True):
            assert torch.equal(pa, pb)
        states_a = [opt_a.state[p] for p in a if p in opt_a.state]
        states_b = [opt_b.state[p] for p in b if p in opt_b.state]
        for sa, sb in zip(states_a, states_b, strict=True):
            assert all(torch.equal(sa[key], sb[key]) for key in sa if key != "momentum_buffer")
