"""Gradient caching (train.micro_batch_size) is exact: the loss and every parameter gradient equal
the one-pass step to 1e-5 relative in float32, for every loss, with negative sets, hard negatives
and GCL's per-sample state, and with dropout on (the RNG of each micro-batch is replayed)."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from crl.models import DualEncoder
from crl.train.build import run_objective
from crl.train.config import TrainConfig
from crl.train.step import PRECISIONS, batch_loss, embed
from crl.train.steps import loss_and_gradients

N, B, DIM, K = 40, 12, 6, 5  # B = 12 in micro-batches of 5: 5 + 5 + 2
RTOL = 1e-5
CPU = torch.device("cpu")

LOSSES: dict[str, dict[str, Any]] = {
    "info_nce": {"loss": {"name": "info_nce", "temperature": 0.2}},
    "info_nce_independent": {"loss": {"name": "info_nce", "temperature": 0.2},
                             "negatives": {"regime": "independent", "m": 15, "seed": 1}},
    "info_nce_tiled": {"loss": {"name": "info_nce", "temperature": 0.2, "block_size": 4}},
    "clip": {"loss": {"name": "clip"}},
    "clip_shared": {"loss": {"name": "clip"}, "negatives": {"regime": "shared", "m": 20}},
    "siglip": {"loss": {"name": "siglip"}},
    "supcon": {"loss": {"name": "supcon", "temperature": 0.3}},
    "gcl": {"loss": {"name": "gcl", "temperature": 0.3, "gcl": {"gamma": 0.7}}},
    "gcl_learnable_independent": {
        "loss": {"name": "gcl", "temperature": 0.3,
                 "gcl": {"gamma": 0.7, "temperature_mode": "global_learnable"}},
        "negatives": {"regime": "independent", "m": 15, "seed": 2}},
    "gcl_per_sample_tiled": {
        "loss": {"name": "gcl", "temperature": 0.3, "block_size": 5,
                 "gcl": {"gamma": 0.7, "temperature_mode": "per_sample"}},
        "negatives": {"regime": "independent", "m": 15, "seed": 3}},
    "oce": {"loss": {"name": "oce", "temperature": 0.3}},
    "pairwise": {"loss": {"name": "pairwise"}},
    "info_nce_kmeans": {"loss": {"name": "info_nce", "kmeans_weight": 0.5, "kmeans_k": 3}},
}


def _tower(dropout: float) -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 8))


def _setup(name: str, dropout: float, *, seed: int = 0) -> tuple[DualEncoder, nn.Module, tuple]:
    torch.manual_seed(seed)
    model = DualEncoder(_tower(dropout), _tower(dropout))
    labels_all = torch.arange(N) % 4
    cfg = TrainConfig.model_validate(LOSSES[name])
    objective = run_objective(cfg, num_samples=N, labels=labels_all, epochs=2, num_classes=4)
    g = torch.Generator().manual_seed(seed + 1)
    index = torch.randperm(N, generator=g)[:B]
    xa = torch.randn(B, DIM, generator=g)
    xb = xa + 0.3 * torch.randn(B, DIM, generator=g)
    batch = (xa, xb, index, labels_all[index])
    return model, objective, batch


def _run(model: nn.Module, objective: nn.Module, batch: tuple, *, micro: int | None,
         precision: str = "fp32", rng_seed: int = 5) -> dict[str, Any]:
    """Loss, gradients, objective state and RNG state after one step's backward."""
    model, objective = copy.deepcopy(model), copy.deepcopy(objective)
    torch.manual_seed(rng_seed)
    value, _ = loss_and_gradients(model, objective, batch, device=CPU,  # type: ignore[arg-type]
                                  micro_batch_size=micro, precision=precision)
    return _outcome(value, model, objective)


def _outcome(value: float, model: nn.Module, objective: nn.Module) -> dict[str, Any]:
    grads = {f"model.{k}": p.grad for k, p in model.named_parameters() if p.requires_grad}
    grads.update({f"objective.{k}": p.grad for k, p in objective.named_parameters()
                  if p.requires_grad})
    return {"loss": value, "grads": grads, "state": copy.deepcopy(objective.state_dict()),
            "rng": torch.get_rng_state()}


def _micro_batched_reference(model: nn.Module, objective: nn.Module, batch: tuple, k: int,
                             rng_seed: int = 5) -> dict[str, Any]:
    """One autograd graph over the micro-batches' forward passes, in the order the cache embeds
    them (so dropout draws the same masks): what the cached step must equal with dropout on."""
    model, objective = copy.deepcopy(model), copy.deepcopy(objective)
    torch.manual_seed(rng_seed)
    xa, xb, index, labels = batch
    parts = [embed(model, xa[s:s + k], xb[s:s + k], None, PRECISIONS["fp32"](CPU))
             for s in range(0, B, k)]
    za, zb = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    loss, _ = batch_loss(objective, model, (za, zb, None), index, labels)  # type: ignore[arg-type]
    loss.backward()
    return _outcome(float(loss.detach()), model, objective)


def _assert_same(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    assert got["loss"] == pytest.approx(want["loss"], rel=RTOL), what
    assert got["grads"].keys() == want["grads"].keys()
    for key, g in want["grads"].items():
        h = got["grads"][key]
        if g is None:
            assert h is None or not bool(h.any()), (what, key)
            continue
        assert h is not None, (what, key)
        scale = max(float(g.abs().max()), 1e-12)
        assert float((g - h).abs().max()) <= RTOL * scale, (what, key, g, h)
    for key, v in want["state"].items():  # GCL's u: updated once per step, not per micro-batch
        w = got["state"][key]
        if not v.is_floating_point():
            assert torch.equal(w, v), (what, key)
            continue
        seen = ~torch.isnan(v)
        assert torch.equal(seen, ~torch.isnan(w)), (what, key)
        if bool(seen.any()):
            scale = max(float(v[seen].abs().max()), 1e-12)
            assert float((v[seen] - w[seen]).abs().max()) <= RTOL * scale, (what, key)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_cached_step_equals_one_pass(name: str) -> None:
    model, objective, batch = _setup(name, dropout=0.0)
    plain = _run(model, objective, batch, micro=None)
    assert any(g is not None and bool(g.any()) for g in plain["grads"].values())
    for k in (K, 1, B):
        _assert_same(_run(model, objective, batch, micro=k), plain, f"{name} k={k}")


@pytest.mark.parametrize("name", ["info_nce_independent", "clip", "gcl_per_sample_tiled",
                                  "siglip"])
def test_cached_step_with_dropout_replays_the_masks(name: str) -> None:
    model, objective, batch = _setup(name, dropout=0.3)
    # One micro-batch: the cache draws exactly what the one-pass step draws.
    plain = _run(model, objective, batch, micro=None)
    whole = _run(model, objective, batch, micro=B)
    _assert_same(whole, plain, f"{name} k=B")
    assert torch.equal(whole["rng"], plain["rng"])  # the RNG moves on as after one pass
    # Several micro-batches: equal to one graph over the same micro-batches' passes.
    cached = _run(model, objective, batch, micro=K)
    _assert_same(cached, _micro_batched_reference(model, objective, batch, K), f"{name} k={K}")
    # ...and not to a second pass that drew other masks (the test can fail).
    torch.manual_seed(99)
    other = _micro_batched_reference(model, objective, batch, K, rng_seed=99)
    assert other["loss"] != pytest.approx(cached["loss"], rel=1e-4)


class _HardInfoNCE(nn.Module):
    """InfoNCE a -> b whose anchor i also contrasts its own H hard negatives, from the formula:
    ``-log exp(s_ii) / (sum_j exp(s_ij) + sum_h exp(a_i . h_ih / tau))``."""

    def __init__(self) -> None:
        super().__init__()
        self.log_tau = nn.Parameter(torch.tensor(-1.0))

    def forward(self, za: Tensor, zb: Tensor, index: Tensor, labels: Tensor, *args: Any,
                rows: slice | None = None, hard: Tensor | None = None
                ) -> tuple[Tensor, dict[str, float]]:
        assert hard is not None and hard.shape[:2] == (za.shape[0], 3)
        tau = self.log_tau.exp()
        batch = za @ zb.T / tau
        extra = torch.einsum("bd,bhd->bh", za, hard) / tau
        logits = torch.cat([batch, extra], dim=1)
        loss = (torch.logsumexp(logits, dim=1) - batch.diagonal()).mean()
        return loss, {}


def _hard_batch(batch: tuple) -> tuple:
    g = torch.Generator().manual_seed(11)
    return (*batch, torch.randn(B, 3, DIM, generator=g))


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_cached_step_with_hard_negatives(dropout: float) -> None:
    model, _, batch = _setup("info_nce", dropout=dropout)
    objective = _HardInfoNCE()
    batch = _hard_batch(batch)
    plain = _run(model, objective, batch, micro=None)
    _assert_same(_run(model, objective, batch, micro=B), plain, "hard k=B")
    if dropout == 0.0:
        _assert_same(_run(model, objective, batch, micro=K), plain, "hard k=K")
    assert plain["grads"]["model.tower_b.0.weight"] is not None


@pytest.mark.parametrize("name", ["info_nce", "clip", "gcl"])
def test_cached_step_with_hard_negatives_of_the_trainer_objective(name: str) -> None:
    """The trainer's own objective, once it takes ``hard=`` (contract C1)."""
    model, objective, batch = _setup(name, dropout=0.0)
    if "hard" not in inspect.signature(objective.forward).parameters:
        pytest.skip("the trainer's objective does not take hard negatives yet")
    batch = _hard_batch(batch)
    plain = _run(model, objective, batch, micro=None)
    _assert_same(_run(model, objective, batch, micro=K), plain, f"{name} hard")


def test_bf16_autocast_keeps_the_loss_and_scale_float32() -> None:
    model, objective, batch = _setup("clip", dropout=0.0)
    xa, xb = batch[0], batch[1]
    za, zb, _ = embed(model, xa, xb, None, PRECISIONS["bf16"](CPU))
    assert za.dtype == zb.dtype == torch.bfloat16  # the objective widens them (plain path)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        raw = model.tower_a(xa)
    assert raw.dtype == torch.bfloat16  # the towers did run in bfloat16
    reference, _, _ = embed(model, xa, xb, None, PRECISIONS["fp32"](CPU))
    assert not torch.equal(za.float(), reference)
    assert torch.allclose(za.float(), reference, atol=3e-2)
    fp32 = _run(model, objective, batch, micro=None)
    bf16 = _run(model, objective, batch, micro=None, precision="bf16")
    scales = [k for k in bf16["grads"] if k.startswith("objective.")]
    assert scales and all(bf16["grads"][k].dtype == torch.float32 for k in scales)  # CLIP's
    for key, g in fp32["grads"].items():
        h = bf16["grads"][key]
        cosine = torch.nn.functional.cosine_similarity(g.flatten(), h.flatten(), dim=0)
        assert float(cosine) > 0.98, key
    # Gradient caching under bf16 equals the one-pass bf16 step (the same bf16 passes).
    _assert_same(_run(model, objective, batch, micro=B, precision="bf16"), bf16, "bf16 k=B")
