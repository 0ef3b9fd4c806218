"""``train.precision: bf16`` with a tiled loss: the towers' bfloat16 embeddings reach the exact
kernel as they are (bf16 tile products, float32 accumulation), the plain path still widens them,
and the step stays close to the float32 one."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import crl.losses.tiled as tiled_module
from crl.models import DualEncoder
from crl.train.build import run_objective
from crl.train.config import TrainConfig
from crl.train.steps import loss_and_gradients

N, B, DIM = 64, 48, 16
CPU = torch.device("cpu")

#: Every loss with a tiled path, tiled (block 16: 3 x 3 tiles of the 48 x 48 batch).
TILED: dict[str, dict[str, Any]] = {
    "info_nce": {"loss": {"name": "info_nce", "temperature": 0.2, "block_size": 16,
                          "symmetric": True}},
    "clip": {"loss": {"name": "clip", "block_size": 16}},
    "gcl_independent": {"loss": {"name": "gcl", "temperature": 0.3, "block_size": 16},
                        "negatives": {"regime": "independent", "m": 20, "seed": 1}},
    "dcl": {"loss": {"name": "dcl", "temperature": 0.2, "block_size": 16}},
}


def _setup(cfg: dict[str, Any]) -> tuple[DualEncoder, nn.Module, tuple[Tensor, ...]]:
    torch.manual_seed(0)

    def tower() -> nn.Module:
        return nn.Sequential(nn.Linear(DIM, 64), nn.Tanh(), nn.Linear(64, 32))

    model = DualEncoder(tower(), tower())
    labels = torch.arange(N) % 4
    objective = run_objective(TrainConfig.model_validate(cfg), num_samples=N, labels=labels,
                              epochs=1, num_classes=4)
    g = torch.Generator().manual_seed(1)
    index = torch.randperm(N, generator=g)[:B]
    xa = torch.randn(B, DIM, generator=g)
    xb = xa + 0.3 * torch.randn(B, DIM, generator=g)
    return model, objective, (xa, xb, index, labels[index])


def _step(model: nn.Module, objective: nn.Module, batch: tuple[Tensor, ...], precision: str,
          monkeypatch: pytest.MonkeyPatch, micro: int | None = None
          ) -> tuple[float, Tensor, list[torch.dtype]]:
    """The step's loss, its parameter gradients as one vector, the dtypes the kernel saw."""
    model, objective = copy.deepcopy(model), copy.deepcopy(objective)
    seen: list[torch.dtype] = []
    kernel = tiled_module.tiled_logsumexp

    def spy(a: Tensor, b: Tensor, *args: Any) -> Any:
        seen.extend([a.dtype, b.dtype])
        return kernel(a, b, *args)

    with monkeypatch.context() as patch:
        patch.setattr(tiled_module, "tiled_logsumexp", spy)
        value, _ = loss_and_gradients(model, objective, batch, device=CPU,  # type: ignore[arg-type]
                                      precision=precision, micro_batch_size=micro)
    params = [*model.parameters(), *objective.parameters()]
    grads = torch.cat([p.grad.flatten() for p in params if p.grad is not None])
    return value, grads, seen


@pytest.mark.parametrize("name", list(TILED))
def test_bf16_tiled_step_multiplies_in_bf16_and_matches_float32(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, objective, batch = _setup(TILED[name])
    fp32, g32, seen32 = _step(model, objective, batch, "fp32", monkeypatch)
    bf16, g16, seen16 = _step(model, objective, batch, "bf16", monkeypatch)
    assert seen32 and set(seen32) == {torch.float32}
    assert seen16 and set(seen16) == {torch.bfloat16}  # the bf16 tile products were used
    assert torch.isfinite(torch.tensor(bf16)) and bool(torch.isfinite(g16).all())
    assert abs(bf16 - fp32) <= 1e-2 * abs(fp32), (bf16, fp32)
    cosine = torch.nn.functional.cosine_similarity(g32, g16, dim=0)
    assert float(cosine) >= 0.99, float(cosine)
    # Gradient caching hands the kernel the same bf16 batch (its embeddings' leaves are bf16);
    # the towers' bf16 weight gradients are then rounded per micro-batch, so close, not equal.
    cached, g_cached, seen_cached = _step(model, objective, batch, "bf16", monkeypatch, micro=16)
    assert set(seen_cached) == {torch.bfloat16}
    assert cached == pytest.approx(bf16, rel=1e-5)
    assert float(torch.nn.functional.cosine_similarity(g_cached, g16, dim=0)) >= 0.999


def test_bf16_plain_path_widens_to_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without tiles the loss sees float32 embeddings (the towers' bf16 output widened)."""
    cfg = {"loss": {"name": "info_nce", "temperature": 0.2}}
    model, objective, batch = _setup(cfg)
    dtypes: list[torch.dtype] = []
    terms = type(objective.loss).terms

    def spy(self: Any, pairs: Any, **kwargs: Any) -> Any:
        dtypes.extend([pairs.za.dtype, pairs.zb.dtype])
        return terms(self, pairs, **kwargs)

    monkeypatch.setattr(type(objective.loss), "terms", spy)
    _, grads, seen = _step(model, objective, batch, "bf16", monkeypatch)
    assert not seen and set(dtypes) == {torch.float32}
    assert bool(torch.isfinite(grads).all())
