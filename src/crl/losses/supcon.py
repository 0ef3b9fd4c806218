"""Supervised contrastive loss (Khosla et al. 2020, the "L_out" form; docs/theory.md §8) as a
registered loss; the math is :mod:`crl.losses.functional.supcon`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from crl._validation import check_positive
from crl.losses.base import AnchorTerms, LossContext, PairBatch, PairLoss
from crl.losses.functional.supcon import supcon_loss, supcon_terms

if TYPE_CHECKING:
    from crl.losses.config import LossConfig


class SupConLoss(PairLoss):
    """:func:`~crl.losses.supcon_loss` with a fixed temperature.

    As a training objective the anchors are both views of the rows asked for, against both
    views of the whole batch; positives share a label (labelled data) or, without labels, an
    index (the two views of one item: SimCLR's NT-Xent).

    Example:
        >>> z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
        >>> round(float(SupConLoss(temperature=1.0)(z, torch.tensor([0, 0, 1, 1]))), 4)
        0.5514
    """

    accepts_negative_sets = False

    def __init__(self, temperature: float = 0.1, *, use_labels: bool = True) -> None:
        super().__init__()
        check_positive("SupConLoss", "temperature", temperature, allow_tensor=False)
        self.temperature = float(temperature)
        self.use_labels = bool(use_labels)

    @classmethod
    def from_config(cls, cfg: LossConfig, ctx: LossContext) -> SupConLoss:
        return cls(cfg.temperature, use_labels=ctx.labelled)

    def forward(self, z: Tensor, labels: Tensor) -> Tensor:
        return supcon_loss(z, labels, temperature=self.temperature)

    def terms(self, batch: PairBatch) -> AnchorTerms:
        groups = batch.labels if self.use_labels and batch.labels is not None else batch.index
        width = batch.za.shape[0]
        rows = torch.arange(int(batch.rows.start), int(batch.rows.stop), device=batch.za.device)
        return supcon_terms(torch.cat([batch.za, batch.zb]), torch.cat([groups, groups]),
                            torch.cat([rows, rows + width]), self.temperature)

    def risk_temperature(self) -> float:
        return self.temperature

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"


__all__ = ["SupConLoss"]
