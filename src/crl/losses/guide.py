"""A guide against false negatives (GISTEmbed, Solatorio 2024; docs/training.md, "False
negatives: the guide"; docs/theory.md §8).

A frozen guide model scores every pair of the training set by its own embeddings ``g_a``,
``g_b`` (unit rows, computed once, without gradient). Candidate ``j`` of anchor ``i`` is a
false negative when the guide scores it above the positive minus a margin:

    absolute: g_a[i] . g_b[j] > p_i - margin        relative: ... > p_i - |p_i| margin

with ``p_i = g_a[i] . g_b[i]``; the same test applies to anchor ``i``'s own hard negatives
(``g_h[i, k]``). The guide is a :class:`~crl.losses.TileMask` over dataset indices, so it
enters every loss as one more negatives mask (``[i, j]`` True where ``j`` stays a negative),
dense for a batch and asked tile by tile inside the exact kernel for huge ones; like every
crl mask it is indexed by sample and serves both directions. The positive is never masked.
This is ``GISTEmbedLoss``'s ``mask_false_negatives`` for the ``a -> b`` logits
(``contrast_anchors`` and ``contrast_positives`` off), tested against it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from crl.losses.tiled import TileMask, densify

MarginStrategy = Literal["absolute", "relative"]


class GuideEmbeddings(NamedTuple):
    """The guide's embeddings of the training set (unit rows, float32).

    Attributes:
        a: ``(N, D_g)`` of the anchors (view a).
        b: ``(N, D_g)`` of the positives (view b).
        hard: ``(N, H, D_g)`` of each pair's hard negatives, or None.
    """

    a: Tensor
    b: Tensor
    hard: Tensor | None = None


class _Both:
    """Two masks at once: a negative of both (a :class:`TileMask`)."""

    def __init__(self, first: TileMask, second: TileMask) -> None:
        self.first, self.second = first, second

    def mask(self, rows_index: Tensor, cols_index: Tensor, /) -> Tensor:
        return self.first.mask(rows_index, cols_index) & self.second.mask(rows_index, cols_index)


class FalseNegativeGuide:
    """The guide's mask over dataset indices (module docstring), a :class:`TileMask`.

    Args:
        embeddings: The guide's :class:`GuideEmbeddings`, or a function that computes them,
            called once at the first use (so a run that is only evaluated never encodes).
        margin: The margin (``loss.guide.margin``).
        strategy: ``"absolute"`` or ``"relative"`` (``loss.guide.margin_strategy``).

    Example:
        >>> g_a = torch.eye(3)
        >>> g_b = torch.tensor([[0.6, 0.0, 0.8], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
        >>> guide = FalseNegativeGuide(GuideEmbeddings(g_a, g_b), margin=0.0)
        >>> guide.mask(torch.arange(3), torch.arange(3)).long().tolist()  # 1 > 0.6: b_1 masked
        [[1, 0, 1], [1, 1, 1], [1, 1, 1]]
    """

    def __init__(self, embeddings: GuideEmbeddings | Callable[[], GuideEmbeddings], *,
                 margin: float = 0.0, strategy: MarginStrategy = "absolute") -> None:
        self._source = embeddings
        self._table: GuideEmbeddings | None = None
        self._threshold: Tensor | None = None
        self.margin = float(margin)
        self.strategy = strategy

    def table(self, device: torch.device) -> tuple[GuideEmbeddings, Tensor]:
        """The embeddings on ``device`` and each pair's threshold ``(N,)`` (computed once)."""
        if self._table is None or self._table.a.device != device:
            source = self._source() if callable(self._source) else self._source
            self._table = GuideEmbeddings(
                source.a.float().to(device), source.b.float().to(device),
                None if source.hard is None else source.hard.float().to(device))
            positive = (self._table.a * self._table.b).sum(dim=1)  # (N,) p_i
            scale = positive.abs() if self.strategy == "relative" else 1.0
            self._threshold = positive - scale * self.margin
        assert self._threshold is not None
        return self._table, self._threshold

    def mask(self, rows_index: Tensor, cols_index: Tensor, /) -> Tensor:
        """``(h, w)`` bool: True where sample ``cols_index[k]`` stays a negative of anchor
        ``rows_index[i]`` (the guide scores it at most the threshold)."""
        table, threshold = self.table(rows_index.device)
        scores = table.a[rows_index] @ table.b[cols_index].T  # (h, w)
        return scores <= threshold[rows_index].unsqueeze(1)

    def hard_mask(self, index: Tensor) -> Tensor | None:
        """``(B, H)`` bool: True where hard negative ``k`` of sample ``index[i]`` stays one;
        None when the training set has no hard negatives."""
        table, threshold = self.table(index.device)
        if table.hard is None:
            return None
        # (B, H, D_g) @ (B, D_g, 1) -> (B, H): each anchor against its own hard negatives
        scores = torch.bmm(table.hard[index], table.a[index].unsqueeze(2)).squeeze(2)
        return scores <= threshold[index].unsqueeze(1)

    def restrict(self, negatives: Tensor | TileMask | None, index: Tensor, rows: slice
                 ) -> Tensor | TileMask:
        """The rows' negatives (an ``(h, B)`` mask, a :class:`TileMask` or None: every other
        member) without the guide's false negatives: dense while the block is not huge."""
        mine = densify(self, index[rows], index)
        if negatives is None:
            return mine
        if isinstance(negatives, Tensor) and isinstance(mine, Tensor):
            return negatives.to(mine.device) & mine
        if isinstance(negatives, Tensor):  # a dense block as large as a huge one: rare
            return negatives & self.mask(index[rows], index)
        return _Both(negatives, self)


__all__ = ["FalseNegativeGuide", "GuideEmbeddings", "MarginStrategy"]
