"""The one interface of every registered loss: per-anchor terms for the rows asked for, and
one reducer that turns them into the mean over anchors or a rank's share of it.

A loss (:class:`PairLoss`) scores the anchors ``rows`` of a batch against all of its
``B`` columns and returns, per direction (``a -> b``, and ``b -> a`` for a symmetric loss), one
term per anchor, and which anchors count (those with a negative). :func:`reduce_terms` makes
the loss from them (docs/distributed.md):

    loss = world * (sum over directions of the sum over counted anchors) / K / (counted anchors
           of the whole batch, added over ranks)

with ``K`` directions. One process asks for every row (``world = 1``): the mean over counted
anchors, averaged over directions. Under ``torchrun`` each rank asks for its own rows of the
gathered batch; the mean of the ranks' values is then the loss of the global batch, and the
gather's backward plus the trainer's gradient averaging give its gradient.

This is pytorch-metric-learning's split of a loss into per-anchor values and a reducer; the
loss is chosen once from the config (:func:`crl.losses.build_objective`, which wraps it in the
run's :class:`~crl.losses.Objective`), as open_clip's ``create_loss`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Protocol

import torch
from torch import Tensor, nn

from crl import distributed
from crl.losses.tiled import BlockSize, TileMask, Tiles

if TYPE_CHECKING:
    from crl.losses.config import LossConfig


class LogitScaleSettings(Protocol):
    """The ``model`` section's fields that set CLIP's logit scale."""

    @property
    def init_logit_scale(self) -> float: ...
    @property
    def max_logit_scale(self) -> float: ...
    @property
    def learn_logit_scale(self) -> bool: ...


@dataclass(frozen=True)
class LogitScaleInit:
    """CLIP's learnable logit scale: initial ``log(1 / tau)``, the largest ``exp(logit_scale)``
    and whether it is trained (the ``model`` section's ``init_logit_scale``,
    ``max_logit_scale`` and ``learn_logit_scale``)."""

    init: float = math.log(1 / 0.07)
    max_scale: float = 100.0
    learnable: bool = True

    @classmethod
    def of(cls, model: LogitScaleSettings) -> LogitScaleInit:
        """The settings of a ``model`` section (:class:`crl.models.config.ModelConfig`)."""
        return cls(model.init_logit_scale, model.max_logit_scale, model.learn_logit_scale)


@dataclass(frozen=True)
class LossContext:
    """What a loss needs to know of the run besides the ``loss`` section.

    Attributes:
        num_samples: Training pairs ``n`` (indices lie in ``[0, n)``).
        labelled: Every training pair has a label (``>= 0``).
        epochs: Epochs of the run (GCL's cosine gamma decay), or None.
        num_classes: Classes of the data, or None.
        logit_scale: CLIP's logit scale settings.
    """

    num_samples: int
    labelled: bool = False
    epochs: int | None = None
    num_classes: int | None = None
    logit_scale: LogitScaleInit = LogitScaleInit()


@dataclass(frozen=True)
class PairBatch:
    """What a loss sees of a batch (the global batch under ``torchrun``).

    Attributes:
        za: ``(B, D)`` view-a embeddings.
        zb: ``(B, D)`` view-b embeddings; ``zb[i]`` is the positive of ``za[i]``.
        index: ``(B,)`` int64 dataset indices.
        labels: ``(B,)`` labels or None.
        rows: The anchors asked for, ``slice(start, stop)`` with ``0 <= start < stop <= B``;
            anchor ``i``'s positive is column ``start + i``.
        negatives: The rows' negatives among the ``B`` columns: an ``(h, B)`` bool mask
            (``[i, j]``: sample ``index[j]`` is a negative of anchor ``index[start + i]``; it
            serves both directions), a :class:`~crl.losses.TileMask` asked tile by tile (huge
            blocks), or None (every other member).
        hard: ``(B, H, D)`` view-b embeddings of each anchor's ``H`` hard negatives (extra
            candidates of that anchor only, in the ``a -> b`` direction), or None.
        tiles: ``"plain"`` (the rows' ``(h, B)`` logits built whole) or the side of the tiles
            the exact kernel visits them in: decided once for the batch
            (:func:`crl.losses.tiled.decide_tiles`, from the loss's ``block_size`` and the
            sizes) by whoever builds it, read by the loss's :meth:`PairLoss.terms`.
        hard_mask: ``(B, H)`` bool, True where hard negative ``k`` of anchor ``i`` is a
            candidate (the guide's, :mod:`crl.losses.guide`), or None: all of them.
    """

    za: Tensor
    zb: Tensor
    index: Tensor
    labels: Tensor | None
    rows: slice
    negatives: Tensor | TileMask | None = None
    hard: Tensor | None = None
    tiles: Tiles = "plain"
    hard_mask: Tensor | None = None

    @property
    def size(self) -> int:
        """``h``, the number of anchors asked for."""
        return int(self.rows.stop) - int(self.rows.start)

    @property
    def whole(self) -> bool:
        """True when every row of the batch is asked for (one process)."""
        return self.size == self.za.shape[0]

    def hard_rows(self) -> Tensor | None:
        """``(h, H, D)``: the hard negatives of the rows asked for (None: none, or ``H = 0``)."""
        if self.hard is None or self.hard.shape[1] == 0:
            return None
        return self.hard[self.rows]

    def hard_mask_rows(self) -> Tensor | None:
        """``(h, H)``: which hard negatives of the rows asked for are candidates (None: all)."""
        if self.hard_mask is None or self.hard_rows() is None:
            return None
        return self.hard_mask[self.rows]


class AnchorTerms(NamedTuple):
    """Per-anchor terms of the rows asked for.

    Attributes:
        values: One ``(h,)`` tensor per direction: each anchor's term.
        counted: ``(h,)`` bool, the anchors that count (None: every one); the others' values are
            ignored.
    """

    values: tuple[Tensor, ...]
    counted: Tensor | None = None


def reduce_terms(terms: AnchorTerms, world: int | None = None) -> Tensor:
    """The loss of per-anchor terms: ``world`` times the rows' sum over counted anchors
    (averaged over directions), over the number of counted anchors of all ranks together.

    With one process (``world = 1``) this is the mean over counted anchors; without a counted
    anchor it is 0 with a working graph.

    Args:
        terms: The loss's :class:`AnchorTerms`.
        world: Ranks that add up their counts (:func:`crl.distributed.all_reduce_sum`); None:
            :func:`crl.distributed.world_size`.

    Returns:
        0-dim tensor.

    Example:
        >>> terms = AnchorTerms((torch.tensor([1.0, 2.0, 6.0]),), torch.tensor([True, True, False]))
        >>> float(reduce_terms(terms))
        1.5
    """
    world = distributed.world_size() if world is None else world
    keep = terms.counted
    total = terms.values[0].sum() if keep is None else terms.values[0][keep].sum()
    for values in terms.values[1:]:
        total = total + (values.sum() if keep is None else values[keep].sum())
    if len(terms.values) > 1:
        total = total / len(terms.values)
    if world == 1:
        return total / (terms.values[0].shape[0] if keep is None else keep.sum().clamp(min=1))
    count = (torch.tensor(terms.values[0].shape[0], device=total.device) if keep is None
             else keep.sum())
    return total * world / distributed.all_reduce_sum(count).clamp(min=1)


class PairLoss(nn.Module):
    """Base class of the registered losses: :meth:`terms` of a :class:`PairBatch`.

    A subclass holds its hyperparameters and learnable state (a logit scale and bias, GCL's
    ``u``), is built from the ``loss`` section by :meth:`from_config` and registered by name in
    :data:`crl.losses.registry.OBJECTIVES`. :meth:`terms` does no input checks (the trainer's
    batches are valid by construction); the loss's public functions and ``forward`` check.
    """

    #: Whether the loss accepts negative sets (``negatives.regime`` other than ``in_batch``).
    accepts_negative_sets: ClassVar[bool] = True
    #: Whether the loss takes hard negatives (``hard=``).
    accepts_hard_negatives: ClassVar[bool] = False
    #: Whether the loss takes a guide against false negatives (``loss.guide``): its negatives
    #: mask and :attr:`PairBatch.hard_mask` are honoured.
    accepts_guide: ClassVar[bool] = False
    #: Whether :meth:`terms` has the exact tiled path (``block_size``; large batches).
    tiled_path: ClassVar[bool] = False
    #: The tile side of that path (None: tiles only for large batches; ``"plain"``: never).
    block_size: BlockSize = None

    @classmethod
    def from_config(cls, cfg: LossConfig, ctx: LossContext) -> PairLoss:
        """The loss of a ``loss`` section."""
        raise NotImplementedError

    def terms(self, batch: PairBatch) -> AnchorTerms:
        """Per-anchor terms of ``batch.rows``."""
        raise NotImplementedError

    def logs(self) -> dict[str, float]:
        """Scalars to log after a step (its learnable scale, GCL's gamma)."""
        return {}

    def risk_temperature(self) -> float:
        """The temperature the loss currently works at (for the held-out contrastive risk)."""
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Tell epoch-dependent state (GCL's gamma schedule) the current epoch."""

    def after_step(self) -> None:
        """Keep learnable scales in range; the trainer calls it after every optimiser step."""


__all__ = ["AnchorTerms", "LogitScaleInit", "LossContext", "PairBatch", "PairLoss",
           "reduce_terms"]
