"""InfoNCE as a registered loss: per-anchor terms of the rows asked for, plain or tiled, with
negative sets and hard negatives (docs/theory.md §8).

Anchor ``i`` of direction ``a -> b`` has the logits ``L_ij = s_ij / tau`` (or ``scale * s_ij``),
``s = za @ zb.T``, over its candidates: its positive ``j = i``, its negatives (the mask, default
every other member) and its ``H`` hard negatives ``L_ik = za_i . hard_ik / tau``. Its term is
``log sum_{candidates} exp(L_ij) - L_ii``. The ``b -> a`` direction uses the same sample-indexed
mask (row ``i`` lists sample ``i``'s negatives) and no hard negatives (they are view-b texts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from crl._validation import check_positive
from crl.losses._common import hard_scores, info_nce_rows, other_direction
from crl.losses.base import AnchorTerms, LossContext, PairBatch, PairLoss
from crl.losses.functional.infonce import info_nce
from crl.losses.tiled import BlockSize, TileMask, anchor_logsumexp

if TYPE_CHECKING:
    from crl.losses.config import LossConfig


def dense_negatives(batch: PairBatch) -> Tensor | None:
    """The rows' ``(h, B)`` negatives mask (a :class:`TileMask` asked once), or None."""
    mask = batch.negatives
    if mask is None or isinstance(mask, Tensor):
        return mask
    return mask.mask(batch.index[batch.rows], batch.index)


def candidates_mask(batch: PairBatch) -> tuple[Tensor, Tensor | None]:
    """``(h, B)`` bool: each anchor's candidates (its negatives and its positive), and which
    anchors have a negative among the columns (None: every anchor)."""
    h, width, start = batch.size, batch.za.shape[0], int(batch.rows.start)
    negatives = dense_negatives(batch)
    own = torch.arange(h, device=batch.za.device)
    if negatives is None:
        return torch.ones(h, width, dtype=torch.bool, device=batch.za.device), None
    candidates = negatives.to(device=batch.za.device, copy=True)
    candidates[own, own + start] = False
    has = candidates.any(dim=1)
    candidates[own, own + start] = True
    return candidates, has


def info_nce_terms(batch: PairBatch, *, symmetric: bool, temperature: float | None = None,
                   scale: Tensor | None = None) -> AnchorTerms:
    """InfoNCE terms of ``batch.rows`` with logits ``s / temperature`` or ``scale * s``.

    Plain or over the exact tiled :func:`~crl.losses.tiled.anchor_logsumexp` (same values and
    gradients) as ``batch.tiles`` says. No checks.
    """
    tau = 1.0 if temperature is None else temperature
    rows, start, hard = batch.rows, int(batch.rows.start), batch.hard_rows()
    hard_mask = batch.hard_mask_rows()  # (h, H) or None: every hard negative
    if batch.tiles != "plain":
        multiplier = scale if scale is not None else 1.0 / float(tau)  # float32 for bf16
        values = []
        directions = [(batch.za, batch.zb, hard), (batch.zb, batch.za, None)]
        for x, y, extra in directions[:2 if symmetric else 1]:
            out = anchor_logsumexp(x[rows], y, multiplier, offset=start,
                                   negatives_mask=batch.negatives,
                                   anchor_index=batch.index[rows], candidate_index=batch.index,
                                   block_size=batch.tiles, extra=extra, check=False,
                                   extra_mask=hard_mask if extra is not None else None)
            values.append(out.lse - out.positive)
            if len(values) == 1:
                counted = out.counts > 1  # the positive and at least one negative
        return AnchorTerms(tuple(values), counted)

    def logits_of(s: Tensor) -> Tensor:
        # s / tau exactly as the plain losses (not s * (1 / tau)), or scale * s
        return s * scale if scale is not None else s / tau

    candidates, has = candidates_mask(batch)
    logits = logits_of(batch.za[rows] @ batch.zb.T)  # (h, B)
    extra = None if hard is None else logits_of(hard_scores(batch.za[rows], hard))  # (h, H)
    values = [info_nce_rows(logits, candidates, start, extra, hard_mask)]
    if symmetric:
        other = other_direction(logits, batch.za, batch.zb, rows, batch.whole, logits_of)
        # Every member (all True): the transpose is the same mask, laid out as `other`.
        both = candidates.T if has is None and batch.whole else candidates
        values.append(info_nce_rows(other, both, start))
    if extra is not None:  # an anchor with a hard negative counts
        has = None if hard_mask is None else (
            hard_mask.any(dim=1) if has is None else has | hard_mask.any(dim=1))
    return AnchorTerms(tuple(values), has)


class InfoNCELoss(PairLoss):
    """InfoNCE / NT-Xent at a fixed temperature (:func:`~crl.losses.info_nce`), one way or
    both (``symmetric``).

    Called as ``loss(a, b, negatives_mask=None)`` it is :func:`~crl.losses.info_nce` (checked);
    the trainer uses :meth:`terms`.

    Example:
        >>> loss = InfoNCELoss(temperature=1.0)
        >>> round(float(loss(torch.eye(3), torch.eye(3))), 4)
        0.5514
    """

    accepts_hard_negatives = True
    accepts_guide = True
    tiled_path = True

    def __init__(self, temperature: float = 0.07, symmetric: bool = False, *,
                 block_size: BlockSize = None) -> None:
        super().__init__()
        check_positive("InfoNCELoss", "temperature", temperature, allow_tensor=False)
        self.temperature = float(temperature)
        self.symmetric = bool(symmetric)
        self.block_size = block_size

    @classmethod
    def from_config(cls, cfg: LossConfig, ctx: LossContext) -> InfoNCELoss:
        return cls(cfg.temperature, cfg.symmetric, block_size=cfg.block_size)

    def forward(self, a: Tensor, b: Tensor,
                negatives_mask: Tensor | TileMask | None = None) -> Tensor:
        return info_nce(a, b, temperature=self.temperature, symmetric=self.symmetric,
                        negatives_mask=negatives_mask, block_size=self.block_size)

    def terms(self, batch: PairBatch) -> AnchorTerms:
        return info_nce_terms(batch, symmetric=self.symmetric, temperature=self.temperature)

    def risk_temperature(self) -> float:
        return self.temperature

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, symmetric={self.symmetric}"


__all__ = ["InfoNCELoss", "candidates_mask", "dense_negatives", "info_nce_terms"]
