"""The OCE risk and the pairwise AUC surrogates as registered losses, over each anchor's
``Delta_ij = s_ij - s_ii`` (docs/theory.md §8); the math is :mod:`crl.losses.functional.oce`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from crl._validation import check_choice, check_positive
from crl.losses._common import anchor_negatives, expand_counted, other_direction
from crl.losses.base import AnchorTerms, LossContext, PairBatch, PairLoss
from crl.losses.functional.oce import OCE_PHIS, PAIRWISE_LOSSES, oce_rows, pairwise_rows
from crl.losses.infonce import dense_negatives

if TYPE_CHECKING:
    from crl.losses.config import LossConfig


def delta_terms(batch: PairBatch, symmetric: bool,
                risk: Callable[[Tensor, Tensor], Tensor]) -> AnchorTerms:
    """Terms ``risk(Delta_i, negatives_i)`` of the rows that have a negative, with
    ``Delta_ij = s_ij - s_ii`` over anchor ``i``'s negatives, in one or both directions (the
    sample-indexed mask serves both). No checks."""
    rows, start, h = batch.rows, int(batch.rows.start), batch.size
    own = torch.arange(h, device=batch.za.device)
    negatives = anchor_negatives(dense_negatives(batch), rows, batch.za.shape[0],
                                 batch.za.device)
    has = negatives.any(dim=1)
    scores = batch.za[rows] @ batch.zb.T  # (h, B)
    values = []
    for direction in range(2 if symmetric else 1):
        s = scores if direction == 0 else other_direction(scores, batch.za, batch.zb, rows,
                                                           batch.whole)
        delta = (s - s[own, own + start].unsqueeze(1))[has]  # (A, B)
        values.append(expand_counted(risk(delta, negatives[has]), has, h))
    return AnchorTerms(tuple(values), has)


class OCELoss(PairLoss):
    """The OCE risk (:func:`~crl.losses.oce_risk`) of ``Delta_ij = s_ij - s_ii`` over each anchor's
    negatives, as a training objective.

    Example:
        >>> from crl.losses.base import PairBatch, reduce_terms
        >>> loss = OCELoss("cvar", alpha=1.0, symmetric=False)
        >>> batch = PairBatch(torch.eye(3), torch.eye(3), torch.arange(3), None, slice(0, 3))
        >>> float(reduce_terms(loss.terms(batch), world=1))  # every Delta is -1
        -1.0
    """

    def __init__(self, phi: str = "kl", *, temperature: float = 0.1, alpha: float = 0.1,
                 symmetric: bool = True) -> None:
        super().__init__()
        self.phi = check_choice("OCELoss", "phi", phi, OCE_PHIS)
        check_positive("OCELoss", "temperature", temperature, allow_tensor=False)
        self.temperature = float(temperature)
        self.alpha = float(alpha)
        self.symmetric = bool(symmetric)

    @classmethod
    def from_config(cls, cfg: LossConfig, ctx: LossContext) -> OCELoss:
        return cls(cfg.oce.phi, temperature=cfg.temperature, alpha=cfg.oce.alpha,
                   symmetric=cfg.symmetric)

    def terms(self, batch: PairBatch) -> AnchorTerms:
        return delta_terms(batch, self.symmetric, lambda delta, mask: oce_rows(
            delta, mask, phi=self.phi, temperature=self.temperature, alpha=self.alpha))

    def risk_temperature(self) -> float:
        return self.temperature


class PairwiseLoss(PairLoss):
    """A pairwise AUC surrogate (:func:`~crl.losses.pairwise_risk`) of ``Delta_ij = s_ij - s_ii``
    over each anchor's negatives, as a training objective; ``temperature`` serves the held-out
    contrastive risk only."""

    def __init__(self, loss: str = "logistic", *, temperature: float = 0.1,
                 symmetric: bool = True) -> None:
        super().__init__()
        self.loss = check_choice("PairwiseLoss", "loss", loss, PAIRWISE_LOSSES)
        self.temperature = float(temperature)
        self.symmetric = bool(symmetric)

    @classmethod
    def from_config(cls, cfg: LossConfig, ctx: LossContext) -> PairwiseLoss:
        return cls(cfg.pairwise_loss, temperature=cfg.temperature, symmetric=cfg.symmetric)

    def terms(self, batch: PairBatch) -> AnchorTerms:
        return delta_terms(batch, self.symmetric,
                           lambda delta, mask: pairwise_rows(delta, mask, loss=self.loss))

    def risk_temperature(self) -> float:
        return self.temperature


__all__ = ["OCELoss", "PairwiseLoss", "delta_terms"]
