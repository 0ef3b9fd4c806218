"""Contrastive losses: pure functions on embeddings or score differences
(:mod:`crl.losses.functional`), the registered losses as ``nn.Module`` s with one interface
(:class:`PairLoss`: per-anchor terms of the rows asked for, one reducer; :mod:`crl.losses.base`),
and a run's :class:`Objective` (the loss, the batch's negatives, the k-means regulariser), built
once from its config by :func:`build_objective`.

Embeddings are used as given (no normalisation inside a loss); ``a[i]`` and ``b[i]`` are a
positive pair. See docs/theory.md §8 for the formulas.

The names below are imported on first use, so ``import crl.losses.config`` (what a run config
needs) loads no loss.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crl.losses.base import AnchorTerms as AnchorTerms
    from crl.losses.base import LogitScaleInit as LogitScaleInit
    from crl.losses.base import LossContext as LossContext
    from crl.losses.base import PairBatch as PairBatch
    from crl.losses.base import PairLoss as PairLoss
    from crl.losses.base import reduce_terms as reduce_terms
    from crl.losses.clip import ClipLoss as ClipLoss
    from crl.losses.config import GclOptions as GclOptions
    from crl.losses.config import GuideOptions as GuideOptions
    from crl.losses.config import LossConfig as LossConfig
    from crl.losses.config import MatryoshkaOptions as MatryoshkaOptions
    from crl.losses.config import OceOptions as OceOptions
    from crl.losses.dcl import DecoupledContrastiveLoss as DecoupledContrastiveLoss
    from crl.losses.functional import OCE_PHIS as OCE_PHIS
    from crl.losses.functional import PAIRWISE_LOSSES as PAIRWISE_LOSSES
    from crl.losses.functional import clip_loss as clip_loss
    from crl.losses.functional import contrastive_risk as contrastive_risk
    from crl.losses.functional import info_nce as info_nce
    from crl.losses.functional import oce_risk as oce_risk
    from crl.losses.functional import pairwise_risk as pairwise_risk
    from crl.losses.functional import relaxed_kmeans as relaxed_kmeans
    from crl.losses.functional import siglip_loss as siglip_loss
    from crl.losses.functional import supcon_loss as supcon_loss
    from crl.losses.gcl import GlobalContrastiveLoss as GlobalContrastiveLoss
    from crl.losses.guide import FalseNegativeGuide as FalseNegativeGuide
    from crl.losses.guide import GuideEmbeddings as GuideEmbeddings
    from crl.losses.infonce import InfoNCELoss as InfoNCELoss
    from crl.losses.kmeans import RelaxedKMeans as RelaxedKMeans
    from crl.losses.matryoshka import MatryoshkaObjective as MatryoshkaObjective
    from crl.losses.objective import Objective as Objective
    from crl.losses.objective import build_objective as build_objective
    from crl.losses.oce import OCELoss as OCELoss
    from crl.losses.oce import PairwiseLoss as PairwiseLoss
    from crl.losses.registry import OBJECTIVES as OBJECTIVES
    from crl.losses.siglip import SigLipLoss as SigLipLoss
    from crl.losses.supcon import SupConLoss as SupConLoss
    from crl.losses.tiled import TileMask as TileMask
    from crl.losses.tiled import anchor_logsumexp as anchor_logsumexp

#: Each public name and the module that defines it.
_HOMES = {
    "AnchorTerms": "base", "LogitScaleInit": "base", "LossContext": "base", "PairBatch": "base",
    "PairLoss": "base", "reduce_terms": "base",
    "GclOptions": "config", "GuideOptions": "config", "LossConfig": "config",
    "MatryoshkaOptions": "config", "OceOptions": "config", "MatryoshkaObjective": "matryoshka",
    "FalseNegativeGuide": "guide", "GuideEmbeddings": "guide",
    "OCE_PHIS": "functional", "PAIRWISE_LOSSES": "functional", "clip_loss": "functional",
    "contrastive_risk": "functional", "info_nce": "functional", "oce_risk": "functional",
    "pairwise_risk": "functional", "relaxed_kmeans": "functional", "siglip_loss": "functional",
    "supcon_loss": "functional",
    "ClipLoss": "clip", "DecoupledContrastiveLoss": "dcl", "GlobalContrastiveLoss": "gcl",
    "InfoNCELoss": "infonce", "OCELoss": "oce", "PairwiseLoss": "oce", "SigLipLoss": "siglip",
    "SupConLoss": "supcon", "RelaxedKMeans": "kmeans",
    "Objective": "objective", "build_objective": "objective", "OBJECTIVES": "registry",
    "TileMask": "tiled", "anchor_logsumexp": "tiled",
}

if not TYPE_CHECKING:  # to mypy every name is imported above

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'crl.losses' has no attribute {name!r}")
        value = getattr(importlib.import_module(f"crl.losses.{home}"), name)
        globals()[name] = value  # later look-ups find it without this function
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "OBJECTIVES",
    "OCE_PHIS",
    "PAIRWISE_LOSSES",
    "AnchorTerms",
    "ClipLoss",
    "DecoupledContrastiveLoss",
    "FalseNegativeGuide",
    "GclOptions",
    "GlobalContrastiveLoss",
    "GuideEmbeddings",
    "GuideOptions",
    "InfoNCELoss",
    "LogitScaleInit",
    "LossConfig",
    "LossContext",
    "MatryoshkaObjective",
    "MatryoshkaOptions",
    "OCELoss",
    "Objective",
    "OceOptions",
    "PairBatch",
    "PairLoss",
    "PairwiseLoss",
    "RelaxedKMeans",
    "SigLipLoss",
    "SupConLoss",
    "TileMask",
    "anchor_logsumexp",
    "build_objective",
    "clip_loss",
    "contrastive_risk",
    "info_nce",
    "oce_risk",
    "pairwise_risk",
    "reduce_terms",
    "relaxed_kmeans",
    "siglip_loss",
    "supcon_loss",
]
