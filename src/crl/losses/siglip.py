"""The SigLIP loss with its learnable scale and bias, as a registered loss (Zhai et al. 2023;
docs/theory.md §8); the math is :mod:`crl.losses.functional.siglip`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from crl.losses._common import anchor_negatives
from crl.losses.base import AnchorTerms, LossContext, PairBatch, PairLoss
from crl.losses.functional.siglip import siglip_loss, siglip_rows
from crl.losses.infonce import dense_negatives

if TYPE_CHECKING:
    from crl.losses.config import LossConfig


class SigLipLoss(PairLoss):
    """The SigLIP loss with learnable ``logit_scale`` (init ``log 10``) and ``logit_bias``
    (init -10), as in Zhai et al. 2023.

    As a training objective anchor ``i``'s term is ``-log sigmoid(L_ii) - sum_{j in neg(i)}
    log sigmoid(-L_ij)``, ``L = exp(logit_scale) * za @ zb.T + logit_bias``, and every anchor
    counts (the mean over anchors is :func:`~crl.losses.siglip_loss`). ``logit_scale`` is clamped
    to at most ``max_logit_scale`` by :meth:`after_step` and before every call ``loss(a, b)``.

    Example:
        >>> loss = SigLipLoss()
        >>> round(float(loss.logit_scale.detach().exp()), 4), float(loss.logit_bias.detach())
        (10.0, -10.0)
    """

    accepts_negative_sets = False

    def __init__(self, init_logit_scale: float = math.log(10.0), init_logit_bias: float = -10.0,
                 max_logit_scale: float = math.log(100.0), learnable: bool = True) -> None:
        super().__init__()
        self.max_logit_scale = float(max_logit_scale)
        self.logit_scale = nn.Parameter(torch.tensor(float(init_logit_scale)),
                                        requires_grad=learnable)
        self.logit_bias = nn.Parameter(torch.tensor(float(init_logit_bias)),
                                       requires_grad=learnable)

    @classmethod
    def from_config(cls, cfg: LossConfig, ctx: LossContext) -> SigLipLoss:
        return cls(learnable=cfg.learnable_scale)

    def clamp_(self) -> None:
        """Clamp ``logit_scale`` in place to at most ``max_logit_scale``."""
        with torch.no_grad():
            self.logit_scale.clamp_(max=self.max_logit_scale)

    def after_step(self) -> None:
        self.clamp_()

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        self.clamp_()
        return siglip_loss(a, b, self.logit_scale.exp(), self.logit_bias)

    def terms(self, batch: PairBatch) -> AnchorTerms:
        rows, start = batch.rows, int(batch.rows.start)
        logits = self.logit_scale.exp() * (batch.za[rows] @ batch.zb.T) + self.logit_bias  # (h, B)
        negatives = anchor_negatives(dense_negatives(batch), rows, logits.shape[1], logits.device)
        return AnchorTerms((siglip_rows(logits, negatives, start),))

    def logs(self) -> dict[str, float]:
        return {"train/logit_scale": float(self.logit_scale.detach().exp()),
                "train/logit_bias": float(self.logit_bias.detach())}

    def risk_temperature(self) -> float:
        return 1.0 / float(self.logit_scale.detach().exp())


__all__ = ["SigLipLoss"]
