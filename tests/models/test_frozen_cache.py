"""The frozen bottom of a transformer cached on content (:mod:`crl.models.frozen_cache`): on a
tiny BERT with its first layer frozen, the cached encoder gives the uncached one's embeddings,
loss and gradients (the frozen part without dropout, cached or not), computes each text once,
is shared by encoders of the same model (every encoder built takes its process's cache) and
refuses what it cannot serve."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from crl.data.base import DataInfo, TextPairDataset
from crl.errors import CrlValueError
from crl.models import build_model
from crl.models.config import ModelConfig
from crl.models.transformer import TransformerEncoder, _layers
from crl.train.build import run_objective
from crl.train.config import TrainConfig
from crl.train.steps import loss_and_gradients

pytest.importorskip("transformers")

CPU = torch.device("cpu")
TEXTS_A = ["add two numbers", "sort items by key", "read a file", "open close file",
           "join strings", "count values"]
TEXTS_B = ["def add(a, b): return a + b", "sorted(items, key=key)", "open(p).read()",
           "f = open(p); f.close()", "'-'.join(strings)", "add two numbers"]
INFO = DataInfo(kind="text", dim_a=None, dim_b=None, image_shape=None, num_classes=None,
                name="texts")


def _model(tiny_bert: Path, freeze: int = 1) -> Any:
    torch.manual_seed(0)
    cfg = ModelConfig(kind="transformer", pretrained=str(tiny_bert), head="linear",
                      embed_dim=16, freeze_layers=freeze)
    return build_model(cfg, INFO)


def _encoders(model: Any) -> list[TransformerEncoder]:
    return [t.backbone for t in {id(t): t for t in (model.tower_a, model.tower_b)}.values()]


def _uncached(model: Any) -> Any:
    for encoder in _encoders(model):
        encoder.frozen_outputs = None
    return model


def _grads(model: Any, batch: tuple) -> tuple[float, dict[str, torch.Tensor]]:
    objective = run_objective(TrainConfig.model_validate({"loss": {"name": "clip"}}),
                              num_samples=len(TEXTS_A), labels=None, epochs=1, num_classes=None)
    torch.manual_seed(5)  # the top layers' dropout draws the same masks both ways
    value, _ = loss_and_gradients(model, objective, batch, device=CPU)
    return value, {k: p.grad for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("freeze", [1, 2])
def test_cached_equals_uncached(tiny_bert: Path, freeze: int) -> None:
    plain = _uncached(_model(tiny_bert, freeze).train())
    cached = copy.deepcopy(plain)
    [outputs] = {id(o): o for o in (e.cache_frozen() for e in _encoders(cached))}.values()
    for encoder in _encoders(plain):  # the frozen part stays in evaluation mode (no dropout)
        frozen = [encoder.model.embeddings, *_layers(encoder.model)[:freeze]]
        assert not any(m.training for f in frozen for m in f.modules())
        assert all(m.training for m in _layers(encoder.model)[freeze:])
    data = plain.prepare(TextPairDataset(TEXTS_A, TEXTS_B))
    xa, xb = data.eval_views()
    batch = (xa, xb, torch.arange(6), torch.full((6,), -1))
    want, got = _grads(plain, batch), _grads(cached, batch)
    assert got[0] == pytest.approx(want[0], rel=1e-6)
    assert got[1].keys() == want[1].keys() and len(want[1]) > (4 if freeze == 1 else 1)
    assert not any(".layer.0." in k or "embeddings" in k for k in got[1])  # frozen: no grads
    for key, g in want[1].items():
        torch.testing.assert_close(got[1][key], g, rtol=1e-4, atol=1e-6)
    # every distinct text once ("add two numbers" is in both views); a new batch reuses them
    assert outputs.computed == len(set(TEXTS_A + TEXTS_B)) == len(outputs)
    with torch.no_grad():
        torch.testing.assert_close(cached.eval().encode_b(xa[3:5]), plain.eval().encode_b(xa[3:5]),
                                   rtol=1e-5, atol=1e-6)
    assert outputs.computed == len(outputs)


def test_shared_between_encoders_and_refusals(tiny_bert: Path) -> None:
    one, two = _encoders(_model(tiny_bert))[0], _encoders(_model(tiny_bert))[0]
    shared = one.cache_frozen()
    assert two.cache_frozen(shared) is shared
    x = _model(tiny_bert).prepare(TextPairDataset(TEXTS_A, TEXTS_B)).eval_views()[0]
    one.eval()(x), two.eval()(x)
    assert shared.computed == len(TEXTS_A)
    with pytest.raises(CrlValueError, match="freeze_layers >= 1"):
        _encoders(_model(tiny_bert, freeze=0))[0].cache_frozen()
    with pytest.raises(CrlValueError, match="holds the states of"):
        _encoders(_model(tiny_bert, freeze=2))[0].cache_frozen(shared)
