"""The trainer's optimisers: torch's multi-tensor update, bit for bit the per-tensor one."""

from __future__ import annotations

import pytest
import torch

from crl.train import lazy_adamw
from crl.train.build import build_optimizer
from crl.train.config import OptimConfig
from crl.train.lazy_adamw import LazyAdamW


def _steps(optimizer_factory, steps: int = 5) -> list[torch.Tensor]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(300, 16)), torch.nn.Parameter(torch.randn(16))]
    optimizer = optimizer_factory(params)
    grads = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=grads)
        optimizer.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_built_optimizer_equals_the_per_tensor_loop(name: str) -> None:
    cfg = OptimConfig(name=name, lr=1e-2, weight_decay=0.05, momentum=0.9)
    built = _steps(lambda ps: build_optimizer(cfg, ps))
    if name == "adamw":
        reference = _steps(lambda ps: torch.optim.AdamW(
            ps, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, foreach=False))
    else:
        reference = _steps(lambda ps: torch.optim.SGD(
            ps, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, foreach=False))
    assert all(torch.equal(a, b) for a, b in zip(built, reference, strict=True))
    assert built[0].ne(_steps(lambda ps: torch.optim.SGD(ps, lr=0.0))[0]).any()  # it moved


def test_built_optimizer_uses_the_multi_tensor_update() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert isinstance(build_optimizer(OptimConfig(), params), LazyAdamW)
    assert build_optimizer(OptimConfig(name="sgd"), params).defaults["foreach"] is True


def test_adamw_in_bounded_runs_is_one_multi_tensor_call_bit_for_bit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The multi-tensor update cut into runs of at most a few values (so its temporaries
    never hold a copy of the whole model) gives the one-call values, and one call is the
    per-tensor loop (above)."""
    cfg = OptimConfig(lr=1e-2, weight_decay=0.05)
    one_call = _steps(lambda ps: torch.optim.AdamW(
        ps, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, foreach=True))
    calls: list[int] = []
    real = lazy_adamw.adamw

    def counted(params: list[torch.Tensor], *args: object, **kwargs: object) -> None:
        calls.append(len(params))
        real(params, *args, **kwargs)

    monkeypatch.setattr(lazy_adamw, "FOREACH_MAX_ELEMENTS", 100)
    monkeypatch.setattr(lazy_adamw, "adamw", counted)
    runs = _steps(lambda ps: build_optimizer(cfg, ps))
    assert calls == [1, 1] * 5  # (300, 16) alone, then (16,): two calls a step
    assert all(torch.equal(a, b) for a, b in zip(runs, one_call, strict=True))
