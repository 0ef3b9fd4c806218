"""Matryoshka with gradient caching (``train.micro_batch_size``) on a tiny BERT: the cached
embedding gradient is the sum over the prefixes, so the cached step gives the loss and the
parameter gradients (the model's and every prefix's loss state) of one pass over the batch."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from crl.data.base import DataInfo, TextPairDataset
from crl.losses import MatryoshkaObjective
from crl.models import build_model
from crl.models.config import ModelConfig
from crl.train.build import run_objective
from crl.train.config import TrainConfig
from crl.train.steps import loss_and_gradients

pytest.importorskip("transformers")

B = 6
CPU = torch.device("cpu")
TEXTS_A = ["add two numbers", "sort items by key", "read a file", "open close file",
           "join strings", "count values"]
TEXTS_B = ["def add(a, b): return a + b", "sorted(items, key=key)", "open(p).read()",
           "f = open(p); f.close()", "'-'.join(strings)", "len(values)"]


def _grads(model: Any, objective: Any, batch: tuple, micro: int | None
           ) -> tuple[float, dict[str, torch.Tensor]]:
    model, objective = copy.deepcopy(model), copy.deepcopy(objective)
    value, _ = loss_and_gradients(model, objective, batch, device=CPU, micro_batch_size=micro)
    params = [*model.named_parameters(), *(("objective." + k, p) for k, p in
                                            objective.named_parameters())]
    return value, {k: p.grad for k, p in params if p.grad is not None}


@pytest.mark.parametrize("loss", [{"name": "clip"}, {"name": "info_nce", "block_size": 2},
                                  {"name": "gcl"}])
def test_cached_equals_one_pass(tiny_bert: Path, loss: dict) -> None:
    torch.manual_seed(0)
    cfg = TrainConfig.model_validate({
        "model": {"kind": "transformer", "pretrained": str(tiny_bert), "head": "linear",
                  "embed_dim": 16},
        "loss": {**loss, "matryoshka": {"dims": [16, 8, 2], "weights": [1.0, 1.0, 0.5]}}})
    info = DataInfo(kind="text", dim_a=None, dim_b=None, image_shape=None, num_classes=None,
                    name="texts")
    model = build_model(ModelConfig.model_validate(cfg.model.model_dump()), info).eval()
    data = model.prepare(TextPairDataset(TEXTS_A, TEXTS_B))
    xa, xb = data.eval_views()
    batch = (xa, xb, torch.arange(B), torch.full((B,), -1))
    objective = run_objective(cfg, num_samples=B, labels=None, epochs=1, num_classes=None)
    assert isinstance(objective, MatryoshkaObjective)
    one = _grads(model, objective, batch, None)
    assert len(one[1]) > 10
    if loss["name"] == "clip":  # every prefix's logit scale is trained
        assert {k for k in one[1] if k.startswith("objective.")} == {
            "objective.loss.logit_scale", "objective.smaller.0.loss.logit_scale",
            "objective.smaller.1.loss.logit_scale"}
    for micro in (4,):  # micro-batches of 4 + 2
        cached = _grads(model, objective, batch, micro)
        assert cached[0] == pytest.approx(one[0], rel=1e-5)
        assert cached[1].keys() == one[1].keys()
        # attention's key bias has a zero gradient in exact arithmetic: noise is measured
        # against the largest gradient
        floor = 1e-4 * max(float(g.abs().max()) for g in one[1].values())
        for key, g in one[1].items():
            scale = max(float(g.abs().max()), floor)
            assert float((cached[1][key] - g).abs().max()) <= 1e-5 * scale, key
