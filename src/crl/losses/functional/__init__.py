"""The losses as pure functions of embeddings or score differences (torchmetrics' functional
layer): one module per objective, each checking its input; the registered losses
(:class:`crl.losses.PairLoss`) hold hyperparameters and learnable state and call them.

Example:
    >>> import torch
    >>> round(float(info_nce(torch.eye(3), torch.eye(3), temperature=1.0)), 4)
    0.5514
"""

from crl.losses.functional.infonce import clip_loss, contrastive_risk, info_nce
from crl.losses.functional.kmeans import relaxed_kmeans
from crl.losses.functional.oce import OCE_PHIS, PAIRWISE_LOSSES, oce_risk, pairwise_risk
from crl.losses.functional.siglip import siglip_loss
from crl.losses.functional.supcon import supcon_loss

__all__ = [
    "OCE_PHIS",
    "PAIRWISE_LOSSES",
    "clip_loss",
    "contrastive_risk",
    "info_nce",
    "oce_risk",
    "pairwise_risk",
    "relaxed_kmeans",
    "siglip_loss",
    "supcon_loss",
]
