"""Contrastive losses: pure functions on embeddings or score differences, and thin modules.

Embeddings are used as given (no normalisation inside a loss); ``a[i]`` and ``b[i]`` are a
positive pair. See ``THEORY.md`` section 1 for the formulas.
"""

from crl.losses.gcl import GlobalContrastiveLoss
from crl.losses.infonce import clip_loss, contrastive_risk, info_nce
from crl.losses.kmeans import relaxed_kmeans
from crl.losses.modules import ClipLoss, InfoNCELoss, SigLipLoss, SupConLoss
from crl.losses.oce import OCE_PHIS, PAIRWISE_LOSSES, oce_risk, pairwise_risk
from crl.losses.siglip import siglip_loss
from crl.losses.supcon import supcon_loss
from crl.losses.tiled import TileMask, anchor_logsumexp

__all__ = [
    "OCE_PHIS",
    "PAIRWISE_LOSSES",
    "ClipLoss",
    "GlobalContrastiveLoss",
    "InfoNCELoss",
    "SigLipLoss",
    "SupConLoss",
    "TileMask",
    "anchor_logsumexp",
    "clip_loss",
    "contrastive_risk",
    "info_nce",
    "oce_risk",
    "pairwise_risk",
    "relaxed_kmeans",
    "siglip_loss",
    "supcon_loss",
]
