"""The decoupled contrastive loss (DCL; Yeh et al. 2022): InfoNCE without the positive in the
denominator.

Anchor ``i``'s term is ``-s_ii / tau + log sum_{j in neg(i)} exp(s_ij / tau)`` with
``s = za @ zb.T`` over its negatives (the mask, default every other member, plus its own hard
negatives in the ``a -> b`` direction); anchors without a negative do not count. It is the
positive-excluded contrastive risk of docs/theory.md §8 divided by ``tau``, plus ``log m_i``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from crl._validation import check_pair, check_positive
from crl.losses.base import (
    AnchorTerms,
    LossContext,
    PairBatch,
    PairLoss,
    reduce_terms,
)
from crl.losses.tiled import BlockSize, anchor_logsumexp, decide_tiles

if TYPE_CHECKING:
    from crl.losses.config import LossConfig


class DecoupledContrastiveLoss(PairLoss):
    """DCL at a fixed temperature, one way or both (``symmetric``); ``loss.name: dcl``.

    Args:
        temperature: ``tau > 0``.
        symmetric: Average the ``a -> b`` and ``b -> a`` directions.
        block_size: Tile side of the exact tiled path (None: tiles only for large batches;
            ``"plain"``: never).

    Example:
        >>> loss = DecoupledContrastiveLoss(temperature=1.0, symmetric=False)
        >>> round(float(loss(torch.eye(3), torch.eye(3))), 4)  # log(2) - 1
        -0.3069
    """

    accepts_hard_negatives = True
    tiled_path = True

    def __init__(self, temperature: float = 0.1, symmetric: bool = True, *,
                 block_size: BlockSize = None) -> None:
        super().__init__()
        check_positive("DecoupledContrastiveLoss", "temperature", temperature,
                       allow_tensor=False)
        self.temperature = float(temperature)
        self.symmetric = bool(symmetric)
        self.block_size = block_size

    @classmethod
    def from_config(cls, cfg: LossConfig, ctx: LossContext) -> DecoupledContrastiveLoss:
        return cls(cfg.temperature, cfg.symmetric, block_size=cfg.block_size)

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        """The mean DCL of paired embeddings ``a, b (B, D)`` with in-batch negatives."""
        where = "DecoupledContrastiveLoss"
        a, b = check_pair(where, a, b)
        batch = a.shape[0]
        tiles = decide_tiles(where, self.block_size, batch, batch)
        index = torch.arange(batch, device=a.device)
        return reduce_terms(self.terms(PairBatch(a, b, index, None, slice(0, batch),
                                                 tiles=tiles)), world=1)

    def terms(self, batch: PairBatch) -> AnchorTerms:
        rows, scale = batch.rows, 1.0 / self.temperature  # the kernel's accumulation dtype
        values, counted = [], None
        directions = [(batch.za, batch.zb, batch.hard_rows()), (batch.zb, batch.za, None)]
        for x, y, extra in directions[:2 if self.symmetric else 1]:
            out = anchor_logsumexp(x[rows], y, scale, offset=int(rows.start),
                                   include_positive=False, negatives_mask=batch.negatives,
                                   anchor_index=batch.index[rows], candidate_index=batch.index,
                                   block_size=batch.tiles, extra=extra, check=False)
            has = out.counts > 0  # an anchor without negatives has lse = -inf: left out
            values.append(torch.where(has, out.lse - out.positive, torch.zeros_like(out.lse)))
            counted = has if counted is None else counted
        return AnchorTerms(tuple(values), counted)

    def risk_temperature(self) -> float:
        return self.temperature

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, symmetric={self.symmetric}"


__all__ = ["DecoupledContrastiveLoss"]
