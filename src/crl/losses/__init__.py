"""Contrastive losses: pure functions on embeddings or score differences, the registered losses
as ``nn.Module`` s with one interface (:class:`PairLoss`: per-anchor terms of the rows asked for,
one reducer; :mod:`crl.losses.base`), and a run's :class:`Objective` (the loss, the batch's
negatives, the k-means regulariser), built once from its config by :func:`build_objective`.

Embeddings are used as given (no normalisation inside a loss); ``a[i]`` and ``b[i]`` are a
positive pair. See docs/theory.md §8 for the formulas.
"""

from crl.losses.base import (
    AnchorTerms,
    LogitScaleInit,
    LossContext,
    PairBatch,
    PairLoss,
    reduce_terms,
)
from crl.losses.clip import ClipLoss
from crl.losses.config import GclOptions, LossConfig, OceOptions
from crl.losses.contrastive import InfoNCELoss
from crl.losses.gcl import GlobalContrastiveLoss
from crl.losses.infonce import clip_loss, contrastive_risk, info_nce
from crl.losses.kmeans import RelaxedKMeans, relaxed_kmeans
from crl.losses.objective import Objective, build_objective
from crl.losses.oce import OCE_PHIS, PAIRWISE_LOSSES, OCELoss, PairwiseLoss, oce_risk, pairwise_risk
from crl.losses.registry import OBJECTIVES
from crl.losses.siglip import SigLipLoss, siglip_loss
from crl.losses.supcon import SupConLoss, supcon_loss
from crl.losses.tiled import TileMask, anchor_logsumexp

__all__ = [
    "OBJECTIVES",
    "OCE_PHIS",
    "PAIRWISE_LOSSES",
    "AnchorTerms",
    "ClipLoss",
    "GclOptions",
    "GlobalContrastiveLoss",
    "InfoNCELoss",
    "LogitScaleInit",
    "LossConfig",
    "LossContext",
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
