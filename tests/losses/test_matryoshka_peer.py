"""crl's Matryoshka objective against sentence-transformers' own ``MatryoshkaLoss``, on the
same tokenised batch through the same tiny BERT: around ``MultipleNegativesRankingLoss``, its
cached form (``CachedMultipleNegativesRankingLoss``) and crl's ``CrlContrastiveLoss``; the
same loss and the same parameter gradients."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

pytest.importorskip("sentence_transformers", reason="needs sentence-transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import (
    CachedMultipleNegativesRankingLoss,
    MatryoshkaLoss,
    MultipleNegativesRankingLoss,
)

from crl.losses import LossConfig, build_objective
from crl.losses.config import MatryoshkaOptions
from crl.losses.sentence_transformers import CrlContrastiveLoss
from crl.negatives import NegativesConfig

DIMS, WEIGHTS = [32, 16, 4], [1.0, 0.5, 2.0]
TEXTS = [["add two numbers", "sort items by key", "read a file", "open close file",
          "join strings", "count values"],
         ["def add return", "sort the list", "open file read", "close the file",
          "join split strings", "count first last"]]


@pytest.fixture(scope="module")
def st_model(tiny_bert: Path) -> SentenceTransformer:
    """The tests' tiny BERT (hidden 32) with mean pooling, in float64 and eval mode (no
    dropout)."""
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    model = SentenceTransformer(modules=[Transformer(str(tiny_bert), max_seq_length=32),
                                         Pooling(32, "mean")], device="cpu")
    return model.double().eval()


def _run(model: SentenceTransformer, loss: nn.Module | None) -> tuple[float, list[Tensor]]:
    """The loss of the batch and the model's parameter gradients; ``loss`` None: crl's
    objective on the model's (normalised) embeddings."""
    model.zero_grad()
    features = [model.tokenize(t) for t in TEXTS]
    if loss is None:
        za, zb = (F.normalize(model(dict(f))["sentence_embedding"], dim=-1) for f in features)
        cfg = LossConfig(name="info_nce", temperature=1 / 20, symmetric=False,
                         matryoshka=MatryoshkaOptions(dims=DIMS, weights=WEIGHTS))
        objective = build_objective(cfg, NegativesConfig(), num_samples=len(TEXTS[0]))
        value = objective(za, zb, torch.arange(za.shape[0]))[0]
    else:
        value = loss(features, None)
    value.backward()
    return float(value.detach()), [p.grad.clone() for p in model.parameters()
                                   if p.grad is not None]


def _assert_same(got: tuple[float, list[Tensor]], want: tuple[float, list[Tensor]]) -> None:
    assert got[0] == pytest.approx(want[0], rel=1e-12)
    assert len(got[1]) == len(want[1]) > 10
    for a, b in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("inner", ["mnrl", "cached_mnrl", "crl"])
def test_matches_matryoshka_loss(st_model: SentenceTransformer, inner: str) -> None:
    losses = {"mnrl": lambda: MultipleNegativesRankingLoss(st_model, scale=20.0),
              "cached_mnrl": lambda: CachedMultipleNegativesRankingLoss(
                  st_model, scale=20.0, mini_batch_size=4),
              "crl": lambda: CrlContrastiveLoss(st_model, scale=20.0)}
    theirs = MatryoshkaLoss(st_model, losses[inner](), DIMS, WEIGHTS)
    ours = _run(st_model, None)
    _assert_same(ours, _run(st_model, theirs))
    # and the prefixes count: the full dimension alone is another loss
    alone = _run(st_model, MultipleNegativesRankingLoss(st_model, scale=20.0))
    assert ours[0] != pytest.approx(alone[0], rel=1e-3)
