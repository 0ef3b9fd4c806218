"""The CLIP loss with its learnable logit scale, as a training objective (docs/theory.md §8).

The logit scale lives here and nowhere else: the trainer optimises and checkpoints it with the
objective (state-dict key ``loss.logit_scale`` of the training objective) and clamps it after
every optimiser step (:meth:`ClipLoss.after_step`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from crl._validation import check_finite_scalar, check_pair
from crl.losses._common import hard_scores, other_direction
from crl.losses.base import AnchorTerms, LossContext, PairBatch, PairLoss
from crl.losses.functional.infonce import clip_loss
from crl.losses.infonce import info_nce_terms
from crl.losses.tiled import BlockSize

if TYPE_CHECKING:
    from crl.losses.config import LossConfig

#: CLIP's initial logit scale, ``log(1 / 0.07)``.
CLIP_INIT_LOGIT_SCALE = math.log(1 / 0.07)
#: CLIP clamps the logit scale so that ``exp(logit_scale) <= 100``.
CLIP_MAX_LOGIT_SCALE = math.log(100.0)


class ClipLoss(PairLoss):
    """The CLIP loss with a learnable ``logit_scale`` (``scale = exp(logit_scale)``).

    ``logit_scale`` starts at ``log(1/0.07)`` (capped to the bounds) and is clamped to
    ``[min_logit_scale, max_logit_scale]`` (default ``[0, log 100]``, as CLIP) by
    :meth:`after_step` and before every call ``loss(a, b)``, so ``1 <= exp(logit_scale) <= 100``.
    With in-batch negatives both directions count (the CLIP loss); with a negatives mask,
    ``symmetric`` decides, as for InfoNCE.

    Args:
        init_logit_scale: Initial ``log(1 / tau)``.
        max_logit_scale: Upper clamp of ``logit_scale``.
        learnable: Train ``logit_scale`` (else it keeps its initial value).
        min_logit_scale: Lower clamp (None: none).
        symmetric: Both directions with a negatives mask.
        block_size: Tile side of the exact tiled path (None: tiles only for large batches;
            ``"plain"``: never).

    Example:
        >>> loss = ClipLoss()
        >>> round(float(loss.logit_scale.detach().exp()), 4)
        14.2857
    """

    accepts_hard_negatives = True
    accepts_guide = True
    tiled_path = True

    def __init__(self, init_logit_scale: float = CLIP_INIT_LOGIT_SCALE,
                 max_logit_scale: float = CLIP_MAX_LOGIT_SCALE, learnable: bool = True, *,
                 min_logit_scale: float | None = 0.0, symmetric: bool = True,
                 block_size: BlockSize = None) -> None:
        super().__init__()
        for name, bound in (("init_logit_scale", init_logit_scale),
                            ("max_logit_scale", max_logit_scale)):
            check_finite_scalar("ClipLoss", name, bound)
        self.max_logit_scale = float(max_logit_scale)
        self.min_logit_scale = None if min_logit_scale is None else float(min_logit_scale)
        value = min(float(init_logit_scale), self.max_logit_scale)
        if self.min_logit_scale is not None:
            value = max(value, self.min_logit_scale)
        self.logit_scale = nn.Parameter(torch.tensor(value), requires_grad=learnable)
        self.symmetric = bool(symmetric)
        self.block_size = block_size

    @classmethod
    def from_config(cls, cfg: LossConfig, ctx: LossContext) -> ClipLoss:
        scale = ctx.logit_scale
        return cls(scale.init, math.log(scale.max_scale), scale.learnable, min_logit_scale=None,
                   symmetric=cfg.symmetric, block_size=cfg.block_size)

    def clamp_(self) -> None:
        """Clamp ``logit_scale`` in place to ``[min_logit_scale, max_logit_scale]``."""
        with torch.no_grad():
            self.logit_scale.clamp_(self.min_logit_scale, self.max_logit_scale)

    def after_step(self) -> None:
        self.clamp_()

    def forward(self, image_features: Tensor, text_features: Tensor,
                logit_scale: Tensor | None = None, logit_bias: Tensor | None = None, *,
                output_dict: bool = False) -> Tensor | dict[str, Tensor]:
        """The CLIP loss of ``image_features (B, D)`` and ``text_features (B, D)``.

        Called as open_clip's ``ClipLoss``: ``loss(image, text, logit_scale)`` with
        ``logit_scale`` the scale itself (``model.logit_scale.exp()``), an optional
        ``logit_bias`` added to every logit, and ``output_dict=True`` for
        ``{"contrastive_loss": loss}``. Without ``logit_scale`` the module's own (clamped first)
        is used.
        """
        if logit_scale is None:
            self.clamp_()
            logit_scale = self.logit_scale.exp()
        if logit_bias is None:
            loss = clip_loss(image_features, text_features, logit_scale,
                             block_size=self.block_size)
        else:
            a, b = check_pair("ClipLoss", image_features, text_features,
                              names=("image_features", "text_features"))
            check_finite_scalar("ClipLoss", "logit_bias", logit_bias)
            logits = logit_scale * (a @ b.T) + logit_bias  # (B, B)
            target = torch.arange(a.shape[0], device=a.device)
            loss = 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))
        return {"contrastive_loss": loss} if output_dict else loss

    def terms(self, batch: PairBatch) -> AnchorTerms:
        scale = self.logit_scale.exp()
        if batch.negatives is not None or batch.tiles != "plain":
            return info_nce_terms(batch, symmetric=self.symmetric or batch.negatives is None,
                                  scale=scale)
        # In-batch negatives, plain: cross-entropy per anchor, as open_clip's ClipLoss.
        rows, hard = batch.rows, batch.hard_rows()
        logits = scale * (batch.za[rows] @ batch.zb.T)  # (h, B)
        target = torch.arange(batch.size, device=logits.device) + int(rows.start)
        first = logits if hard is None else torch.cat(
            [logits, scale * hard_scores(batch.za[rows], hard)], dim=1)  # (h, B + H)
        forward = F.cross_entropy(first, target, reduction="none")
        other = other_direction(logits, batch.za, batch.zb, rows, batch.whole,
                                lambda s: scale * s)
        return AnchorTerms((forward, F.cross_entropy(other, target, reduction="none")))

    def logs(self) -> dict[str, float]:
        return {"train/logit_scale": float(self.logit_scale.detach().exp())}

    def risk_temperature(self) -> float:
        return 1.0 / float(self.logit_scale.detach().exp())


__all__ = ["CLIP_INIT_LOGIT_SCALE", "CLIP_MAX_LOGIT_SCALE", "ClipLoss"]
