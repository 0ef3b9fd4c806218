"""The training objectives by name: ``loss.name`` of a run config picks one class here, once.

Adding a loss: a :class:`~crl.losses.base.PairLoss` subclass in its own file (with
``from_config`` and ``terms``), one entry below, and its tests; ``loss.name`` accepts the new
name from then on.
"""

from __future__ import annotations

from crl.losses.base import PairLoss
from crl.losses.clip import ClipLoss
from crl.losses.contrastive import InfoNCELoss
from crl.losses.dcl import DecoupledContrastiveLoss
from crl.losses.gcl import GlobalContrastiveLoss
from crl.losses.oce import OCELoss, PairwiseLoss
from crl.losses.siglip import SigLipLoss
from crl.losses.supcon import SupConLoss

#: ``loss.name`` -> the objective's class.
OBJECTIVES: dict[str, type[PairLoss]] = {
    "info_nce": InfoNCELoss,
    "clip": ClipLoss,
    "siglip": SigLipLoss,
    "supcon": SupConLoss,
    "gcl": GlobalContrastiveLoss,
    "oce": OCELoss,
    "pairwise": PairwiseLoss,
    "dcl": DecoupledContrastiveLoss,
}

__all__ = ["OBJECTIVES"]
