"""The training objective of a run, built once from its ``loss`` and ``negatives`` sections
(:func:`build_objective`): the registered loss, the batch's negatives and the optional relaxed
k-means regulariser, reduced to the loss of a batch or a rank's share of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

from crl import distributed
from crl._validation import check_rows, compute_dtype, upcast
from crl.errors import CrlValueError
from crl.losses.base import (
    LogitScaleInit,
    LossContext,
    PairBatch,
    PairLoss,
    reduce_terms,
)
from crl.losses.guide import FalseNegativeGuide
from crl.losses.kmeans import RelaxedKMeans
from crl.losses.registry import loss_class
from crl.losses.tiled import TileMask, Tiles, decide_tiles, densify
from crl.negatives import NegativesConfig, NegativeSets, build_negative_sets

if TYPE_CHECKING:
    from crl.losses.config import LossConfig


class BatchNegatives:
    """Who is a negative of whom in a batch: the negative sets (asked without checks), the
    other members with another label (``exclude_same_label``), or every other member (None);
    then, with a guide, without its false negatives.

    Args:
        sets: The run's :class:`~crl.negatives.NegativeSets`, or None.
        exclude_same_label: Without sets, drop same-label members (needs labels).
        guide: The run's :class:`~crl.losses.guide.FalseNegativeGuide` (``loss.guide``), or
            None.
    """

    def __init__(self, sets: NegativeSets | None, exclude_same_label: bool = False,
                 guide: FalseNegativeGuide | None = None) -> None:
        self.sets = sets
        self._trusted = None if sets is None else sets.trusted()
        self.exclude_same_label = bool(exclude_same_label)
        self.guide = guide

    def __call__(self, index: Tensor, labels: Tensor | None, rows: slice
                 ) -> Tensor | TileMask | None:
        """The negatives of the anchors ``index[rows]`` among all of ``index``: an ``(h, B)``
        bool mask, a :class:`TileMask` for a huge block, or None for every other member."""
        base = self._base(index, labels, rows)
        return base if self.guide is None else self.guide.restrict(base, index, rows)

    def hard_mask(self, index: Tensor) -> Tensor | None:
        """``(B, H)`` bool: which hard negatives stay candidates (None: all of them)."""
        return None if self.guide is None else self.guide.hard_mask(index)

    def _base(self, index: Tensor, labels: Tensor | None, rows: slice
              ) -> Tensor | TileMask | None:
        if self._trusted is not None:
            return densify(self._trusted, index[rows], index)
        if self.exclude_same_label:
            if labels is None:
                raise CrlValueError("negatives.exclude_same_label needs the batch's labels; "
                                    "got labels=None")
            return labels[rows].unsqueeze(1) != labels.unsqueeze(0)
        return None


class Objective(nn.Module):
    """A run's objective: ``loss, logs = objective(za, zb, index, labels, rows=, hard=)``.

    Holds the loss (submodule ``loss``, with its learnable state: CLIP's logit scale, SigLIP's
    scale and bias, GCL's ``u`` and temperatures), so it is optimised and checkpointed with the
    model. Calls check shapes only (no host synchronisation); the trainer calls
    :meth:`after_step` after every optimiser step.

    Args:
        loss: The registered loss (a :class:`~crl.losses.PairLoss`).
        negatives: The batch's negatives.
        regulariser: The relaxed k-means regulariser, or None.
    """

    #: The prefix dimensions it also trains (:class:`~crl.losses.matryoshka.MatryoshkaObjective`).
    prefix_dims: tuple[int, ...] = ()

    def __init__(self, loss: PairLoss, negatives: BatchNegatives,
                 regulariser: RelaxedKMeans | None = None) -> None:
        super().__init__()
        self.loss = loss
        self.negatives = negatives
        self.regulariser = regulariser

    def forward(self, za: Tensor, zb: Tensor, index: Tensor, labels: Tensor | None = None, *,
                rows: slice | None = None, hard: Tensor | None = None
                ) -> tuple[Tensor, dict[str, float]]:
        """The loss of a batch (or this rank's share of it) and scalars to log.

        Args:
            za: ``(B, D)`` view-a embeddings (the global batch under ``torchrun``); bfloat16
                ones are widened to float32 unless the loss runs tiled (bf16 tile products).
            zb: ``(B, D)`` view-b embeddings; ``zb[i]`` is the positive of ``za[i]``.
            index: ``(B,)`` int64 dataset indices.
            labels: ``(B,)`` labels or None.
            rows: This rank's anchors, a contiguous slice (None: every row).
            hard: ``(B, H, D)`` hard negatives of each anchor (view b), or None.

        Returns:
            ``(loss, logs)``: a 0-dim tensor and a dict of floats. Over the ranks of a process
            group the mean of the losses is the loss of the global batch.

        Raises:
            CrlValueError: on inconsistent shapes, a bad ``rows``, or hard negatives for a loss
                that takes none.
        """
        batch = za.shape[0]
        if za.dim() != 2 or zb.shape != za.shape or tuple(index.shape) != (batch,):
            raise CrlValueError(f"objective: `za`, `zb` must be (B, D) and `index` (B,); got "
                                f"{tuple(za.shape)}, {tuple(zb.shape)}, {tuple(index.shape)}")
        if hard is not None:
            if not self.loss.accepts_hard_negatives:
                raise CrlValueError(f"objective: loss {type(self.loss).__name__} takes no hard "
                                    "negatives (InfoNCE, CLIP and GCL do); got `hard`")
            if hard.dim() != 3 or hard.shape[0] != batch or hard.shape[2] != za.shape[1]:
                raise CrlValueError(f"objective: `hard` must be (B, H, D) = ({batch}, H, "
                                    f"{za.shape[1]}); got {tuple(hard.shape)}")
        rows = check_rows("objective", rows, batch)
        # Plain or tiled, decided here once; the loss reads it from the batch.
        tiles: Tiles = decide_tiles("objective", self.loss.block_size, rows.stop - rows.start,
                                    batch) if self.loss.tiled_path else "plain"
        wide = compute_dtype(za, zb)  # float32 for bfloat16 embeddings
        if tiles == "plain":  # only the kernel takes bf16
            za, zb = upcast(za, wide), upcast(zb, wide)
            hard = None if hard is None else upcast(hard, wide)
        terms = self.loss.terms(PairBatch(
            za, zb, index, labels, rows, self.negatives(index, labels, rows), hard, tiles,
            None if hard is None else self.negatives.hard_mask(index)))
        loss = reduce_terms(terms, distributed.world_size())
        logs = self.loss.logs()
        if self.regulariser is not None:
            penalty, more = self.regulariser(upcast(za, wide), upcast(zb, wide))
            loss = loss + penalty
            logs.update(more)
        return loss, logs

    def temperature(self) -> float:
        """The temperature the loss currently works at (for the held-out contrastive risk)."""
        return self.loss.risk_temperature()

    def set_epoch(self, epoch: int) -> None:
        """Tell epoch-dependent state (GCL's gamma schedule) the current epoch."""
        self.loss.set_epoch(epoch)

    def after_step(self) -> None:
        """Clamp learnable scales and temperatures; call after every optimiser step."""
        self.loss.after_step()


def build_objective(loss: LossConfig, negatives: NegativesConfig, *, num_samples: int,
                    labels: Tensor | None = None, epochs: int | None = None,
                    num_classes: int | None = None,
                    logit_scale: LogitScaleInit | None = None,
                    normalized: bool = True,
                    guide: FalseNegativeGuide | None = None) -> Objective:
    """The training objective of a run's ``loss`` and ``negatives`` sections, chosen once.

    Args:
        loss: The ``loss`` section (``loss.name`` picks a class of
            :data:`crl.losses.registry.OBJECTIVES`).
        negatives: The ``negatives`` section.
        num_samples: Training pairs ``n``.
        labels: ``(n,)`` training labels (``-1`` or None: unlabelled).
        epochs: Epochs of the run (GCL's cosine gamma decay).
        num_classes: Classes of the data (the k-means regulariser's default ``k``).
        logit_scale: CLIP's logit scale settings (the ``model`` section's
            ``init_logit_scale``, ``max_logit_scale``, ``learn_logit_scale``); None: CLIP's.
        normalized: The embeddings are L2-normalised (``model.normalize``): with
            ``loss.matryoshka``, each prefix is normalised again.
        guide: The guide against false negatives of ``loss.guide``, built by the caller from
            the training texts (:func:`crl.train.build.build_guide`); None: none.

    Returns:
        The :class:`Objective`; with ``loss.matryoshka``, a
        :class:`~crl.losses.matryoshka.MatryoshkaObjective` of one per prefix.

    Raises:
        CrlValueError: for ``exclude_same_label`` without labels, ``m > n``, or a guide for a
            loss that takes none.

    Example:
        >>> import torch
        >>> from crl.losses.config import LossConfig
        >>> objective = build_objective(LossConfig(temperature=1.0, symmetric=False),
        ...                             NegativesConfig(), num_samples=10)
        >>> loss, logs = objective(torch.eye(3), torch.eye(3), torch.arange(3))
        >>> round(float(loss), 4)
        0.5514
    """
    labelled = labels is not None and bool((labels >= 0).all())
    sets = build_negative_sets(negatives, num_samples, labels if labelled else None)
    context = LossContext(num_samples, labelled, epochs, num_classes,
                               logit_scale or LogitScaleInit())
    regulariser = None
    if loss.kmeans_weight > 0:
        regulariser = RelaxedKMeans(loss.kmeans_weight, loss.kmeans_k or num_classes or 10)
    cls = loss_class(loss.name)
    if guide is not None and not cls.accepts_guide:
        raise CrlValueError(f"loss.guide: loss {loss.name!r} takes no guide (info_nce, clip and "
                            "gcl do); remove loss.guide or change loss.name")
    batch_negatives = BatchNegatives(sets, negatives.exclude_same_label, guide)

    def one() -> Objective:
        return Objective(cls.from_config(loss, context), batch_negatives, regulariser)

    if loss.matryoshka is None:
        return one()
    from crl.losses.matryoshka import MatryoshkaObjective  # it imports this module

    pairs = loss.matryoshka.pairs()
    return MatryoshkaObjective([one() for _ in pairs], [d for d, _ in pairs],
                               [w for _, w in pairs], normalize=normalized)


__all__ = ["BatchNegatives", "Objective", "build_objective"]
