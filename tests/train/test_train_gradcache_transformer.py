"""Gradient caching with a transformer tower (a tiny BERT with dropout on) and gradient
checkpointing: the replayed micro-batches draw the same dropout masks, and checkpointing changes
no number."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from crl.data.base import DataInfo, TextPairDataset
from crl.models import build_model
from crl.models.config import ModelConfig
from crl.train.build import run_objective
from crl.train.config import TrainConfig
from crl.train.step import PRECISIONS, batch_loss, embed
from crl.train.steps import loss_and_gradients

pytest.importorskip("transformers")

B, K = 6, 4
CPU = torch.device("cpu")
TEXTS_A = ["add two numbers", "sort items by key", "read a file", "open close file",
           "join strings", "count values"]
TEXTS_B = ["def add(a, b): return a + b", "sorted(items, key=key)", "open(p).read()",
           "f = open(p); f.close()", "'-'.join(strings)", "len(values)"]


def _setup(model_dir: Path, checkpointing: bool) -> tuple[Any, Any, tuple]:
    torch.manual_seed(0)
    cfg = ModelConfig(kind="transformer", pretrained=str(model_dir), head="linear",
                      embed_dim=16, gradient_checkpointing=checkpointing)
    info = DataInfo(kind="text", dim_a=None, dim_b=None, image_shape=None, num_classes=None,
                    name="texts")
    model = build_model(cfg, info)
    model.train()  # BERT's dropout is on
    data = model.prepare(TextPairDataset(TEXTS_A, TEXTS_B))
    xa, xb = data.eval_views()
    objective = run_objective(TrainConfig.model_validate({"loss": {"name": "clip"}}),
                              num_samples=B, labels=None, epochs=1, num_classes=None)
    return model, objective, (xa, xb, torch.arange(B), torch.full((B,), -1))


def _grads(model: Any, objective: Any, batch: tuple, micro: int | None) -> tuple[float, dict]:
    model, objective = copy.deepcopy(model), copy.deepcopy(objective)
    torch.manual_seed(3)
    value, _ = loss_and_gradients(model, objective, batch, device=CPU, micro_batch_size=micro)
    return value, {k: p.grad for k, p in model.named_parameters() if p.grad is not None}


def _assert_close(got: tuple[float, dict], want: tuple[float, dict]) -> None:
    assert got[0] == pytest.approx(want[0], rel=1e-5)
    assert got[1].keys() == want[1].keys() and len(want[1]) > 10
    # Some gradients are zero in exact arithmetic (attention's key bias: softmax ignores a
    # shift), so their rounding noise is measured against the largest gradient.
    floor = 1e-4 * max(float(g.abs().max()) for g in want[1].values())
    for key, g in want[1].items():
        scale = max(float(g.abs().max()), floor)
        assert float((got[1][key] - g).abs().max()) <= 1e-5 * scale, key


def _by_length(x: torch.Tensor) -> torch.Tensor:
    """A view's rows sorted by their token count, longest first, ties in row order."""
    return torch.sort(x[:, 1].sum(dim=1), descending=True, stable=True).indices


def _micro_batched_reference(model: Any, objective: Any, batch: tuple) -> tuple[float, dict]:
    """One graph over the passes of micro-batches of K texts, each view's sorted by length,
    in the cache's order (a's first micro-batch, b's first, a's second, ...: the same masks)."""
    model, objective = copy.deepcopy(model), copy.deepcopy(objective)
    torch.manual_seed(3)
    xa, xb, index, labels = batch
    order_a, order_b = _by_length(xa), _by_length(xb)
    assert not torch.equal(order_a, torch.arange(B))  # the sort moves rows here
    parts = [embed(model, xa[order_a[s:s + K]], xb[order_b[s:s + K]], None,
                   PRECISIONS["fp32"](CPU)) for s in range(0, B, K)]
    za = torch.cat([p[0] for p in parts])
    zb = torch.cat([p[1] for p in parts])
    z = (torch.empty_like(za).index_copy(0, order_a, za),
         torch.empty_like(zb).index_copy(0, order_b, zb), None)
    loss, _ = batch_loss(objective, model, z, index, labels)
    loss.backward()
    return float(loss.detach()), {k: p.grad for k, p in model.named_parameters()
                                  if p.grad is not None}


def test_transformer_cached_step_with_dropout_and_checkpointing(tiny_bert: Path) -> None:
    model, objective, batch = _setup(tiny_bert, checkpointing=True)
    # one micro-batch: the dropout masks of one pass
    _assert_close(_grads(model, objective, batch, B), _grads(model, objective, batch, None))
    # micro-batches of 4 (4 + 2): the masks of those passes, replayed in the second pass
    cached = _grads(model, objective, batch, K)
    _assert_close(cached, _micro_batched_reference(model, objective, batch))
    assert cached[0] != pytest.approx(_grads(model, objective, batch, None)[0], rel=1e-4)


def test_gradient_checkpointing_changes_no_number(tiny_bert: Path) -> None:
    on, objective, batch = _setup(tiny_bert, True)
    off, _, _ = _setup(tiny_bert, False)
    _assert_close(_grads(on, objective, batch, K), _grads(off, objective, batch, K))
