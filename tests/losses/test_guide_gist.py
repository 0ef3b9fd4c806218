"""The guide against false negatives (:mod:`crl.losses.guide`) against sentence-transformers'
own ``GISTEmbedLoss`` on the same embeddings and guide embeddings (its ``a -> b`` logits:
``contrast_anchors`` and ``contrast_positives`` off), absolute and relative margins, with and
without hard negatives, for InfoNCE and CLIP: the same loss and the same gradients."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

pytest.importorskip("sentence_transformers", reason="needs sentence-transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sentence_transformers.sentence_transformer.losses import gist_embed

from crl.losses import FalseNegativeGuide, GuideEmbeddings, LogitScaleInit, build_objective
from crl.losses.config import LossConfig
from crl.negatives import NegativesConfig

B, D, DG, TAU = 12, 8, 6, 0.05


def unit(x: Tensor) -> Tensor:
    return F.normalize(x, dim=-1)


def guide_embeddings(seed: int, hard: bool) -> list[Tensor]:
    """Guide embeddings ``[a, b, (negatives)]`` where some pairs' documents lie close to other
    anchors' (false negatives the guide must catch) but every anchor keeps a negative."""
    g = torch.Generator().manual_seed(seed)
    a = unit(torch.randn(B, DG, generator=g, dtype=torch.float64))
    b = unit(a + 0.6 * torch.randn(B, DG, generator=g, dtype=torch.float64))
    b[3] = unit(a[2] + 1.2 * a[3])
    b[7] = unit(a[7] + a[8])
    out = [a, b]
    if hard:
        n = unit(torch.randn(B, DG, generator=g, dtype=torch.float64))
        n[0], n[5] = unit(a[0] + 0.1 * n[0]), unit(a[4])
        out.append(n)
    return out


@pytest.fixture(scope="module")
def peer_models(tiny_bert: Path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    def make():
        return SentenceTransformer(modules=[Transformer(str(tiny_bert)), Pooling(32, "mean")],
                                   device="cpu")

    return make(), make()


def peer_loss(models, model_z: list[Tensor], guide_z: list[Tensor], margin: float,
              strategy: str, monkeypatch: pytest.MonkeyPatch) -> Tensor:
    model, guide = models
    table = {id(model): model_z, id(guide): guide_z}
    monkeypatch.setattr(gist_embed, "embed_columns", lambda m, features: table[id(m)])
    loss = gist_embed.GISTEmbedLoss(model, guide, temperature=TAU, margin_strategy=strategy,
                                    margin=margin, contrast_anchors=False,
                                    contrast_positives=False)
    return loss([{} for _ in model_z], None)


def crl_loss(name: str, z: list[Tensor], guide_z: list[Tensor], margin: float,
             strategy: str) -> Tensor:
    hard_g = None if len(guide_z) == 2 else guide_z[2].unsqueeze(0).expand(B, B, DG)
    guide = FalseNegativeGuide(GuideEmbeddings(guide_z[0], guide_z[1], hard_g), margin=margin,
                               strategy=strategy)  # type: ignore[arg-type]
    objective = build_objective(
        LossConfig(name=name, temperature=TAU, symmetric=False), NegativesConfig(),
        num_samples=B, logit_scale=LogitScaleInit(math.log(1 / TAU), 1 / TAU, False),
        guide=guide).double()
    if name == "clip":  # the scale exactly 1 / tau in float64 (it was built in float32)
        objective.loss.logit_scale.data.fill_(math.log(1 / TAU))
    # GISTEmbedLoss's negatives column is every anchor's: each anchor's own H = B hard negatives
    hard = None if len(z) == 2 else z[2].unsqueeze(0).expand(B, B, D)
    loss, _ = objective(z[0], z[1], torch.arange(B), hard=hard)
    return loss


@pytest.mark.parametrize("name", ["info_nce", "clip"])
@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize(("strategy", "margin"),
                         [("absolute", 0.0), ("absolute", 0.1), ("relative", 0.05)])
def test_equals_gist_embed_loss(peer_models, monkeypatch: pytest.MonkeyPatch, name: str,
                                hard: bool, strategy: str, margin: float) -> None:
    g = torch.Generator().manual_seed(1)
    leaves = [torch.randn(B, D, generator=g, dtype=torch.float64).requires_grad_(True)
              for _ in range(3 if hard else 2)]
    guide_z = guide_embeddings(2, hard)
    # GISTEmbedLoss scores by cosine; crl by the dot product of what the towers give (unit)
    ours = crl_loss(name, [unit(x) for x in leaves], guide_z, margin, strategy)
    mine = torch.autograd.grad(ours, leaves)
    theirs = peer_loss(peer_models, leaves, guide_z, margin, strategy, monkeypatch)
    peer = torch.autograd.grad(theirs, leaves)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    for x, y in zip(mine, peer, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)
    # ... and the guide changed something: without it the loss differs
    unguided = crl_loss(name, [unit(x) for x in leaves], guide_z, -10.0, "absolute")
    if margin >= 0:
        assert abs(unguided.item() - ours.item()) > 1e-3


def test_an_anchor_without_negatives_does_not_count(peer_models,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Where they differ: the guide masks every negative of anchor 3; GISTEmbedLoss counts its
    0 in the mean over B anchors, crl (as with any negatives mask) averages over the anchors
    that have a negative."""
    g = torch.Generator().manual_seed(1)
    z = [unit(torch.randn(B, D, generator=g, dtype=torch.float64)) for _ in range(2)]
    guide_z = guide_embeddings(2, False)
    guide_z[1][3] = unit(-guide_z[0][3])  # a_3's positive scores -1 to the guide
    theirs = peer_loss(peer_models, z, guide_z, 0.0, "absolute", monkeypatch)
    ours = crl_loss("info_nce", z, guide_z, 0.0, "absolute")
    torch.testing.assert_close(ours * (B - 1), theirs * B, rtol=1e-12, atol=1e-12)
