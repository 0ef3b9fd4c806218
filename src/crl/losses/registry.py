"""The registered losses by name: ``loss.name`` of a run config picks one class here, once.

Adding a loss: a :class:`~crl.losses.base.PairLoss` subclass in its own file (with
``from_config`` and ``terms``), one entry below, its name in
:data:`crl.losses.config.LossName` (which ``loss.name`` accepts), and its tests.
"""

from __future__ import annotations

from crl.errors import CrlValueError
from crl.losses.base import PairLoss
from crl.losses.clip import ClipLoss
from crl.losses.dcl import DecoupledContrastiveLoss
from crl.losses.gcl import GlobalContrastiveLoss
from crl.losses.infonce import InfoNCELoss
from crl.losses.oce import OCELoss, PairwiseLoss
from crl.losses.siglip import SigLipLoss
from crl.losses.supcon import SupConLoss

#: ``loss.name`` -> the loss's class.
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


def loss_class(name: str) -> type[PairLoss]:
    """The registered loss called ``name``.

    Raises:
        CrlValueError: naming the registered losses, for any other name.

    Example:
        >>> loss_class("clip").__name__
        'ClipLoss'
    """
    cls = OBJECTIVES.get(name)
    if cls is None:
        valid = ", ".join(repr(n) for n in OBJECTIVES)
        raise CrlValueError(f"loss.name must be one of the registered losses {valid}; got {name!r}")
    return cls


__all__ = ["OBJECTIVES", "loss_class"]
