"""Which entries of each tile of the tiled kernel are candidates (:mod:`crl.losses._tiled_kernel`):
the :class:`TileMask` protocol and the per-tile source :class:`TileNegatives`."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from crl._validation import describe
from crl.errors import CrlValueError


@runtime_checkable
class TileMask(Protocol):
    """Anything that gives the negatives mask of one tile from dataset indices.

    ``mask(rows_index (h,), cols_index (w,))`` returns an ``(h, w)`` bool tensor, True where
    sample ``cols_index[k]`` is a negative of anchor ``rows_index[i]``. It must be deterministic:
    the backward pass asks for each tile again. :class:`crl.negatives.NegativeSets` is one.
    """

    def mask(self, rows_index: Tensor, cols_index: Tensor, /) -> Tensor:
        """The ``(h, w)`` bool negatives mask of anchors ``rows_index`` and candidates
        ``cols_index``."""
        ...


class TileNegatives:
    """Which entries of each tile are candidates: from nothing, a dense ``(h, W)`` bool, or a
    :class:`TileMask` asked with the anchors' and candidates' dataset indices.

    Anchor (row) ``i``'s positive is candidate (column) ``offset + i``. ``include_positive``
    says whether it is a candidate (InfoNCE) or not (the negatives-only log-sum-exp of GCL);
    whatever the mask says about that entry is overridden. Built, checked, by
    :func:`crl.losses.tiled.tile_negatives`.
    """

    def __init__(self, dense: Tensor | None, tile_mask: TileMask | None,
                 anchor_index: Tensor | None, candidate_index: Tensor | None, *,
                 include_positive: bool, offset: int = 0) -> None:
        self.dense = dense
        self.tile_mask = tile_mask
        self.anchor_index = anchor_index
        self.candidate_index = candidate_index
        self.include_positive = include_positive
        self.offset = offset

    @property
    def trivial(self) -> bool:
        """True when every entry of every tile is a candidate (no mask, positive included)."""
        return self.dense is None and self.tile_mask is None and self.include_positive

    def positives(self, r0: int, r1: int, c0: int, c1: int) -> tuple[int, int, int]:
        """The rows ``[lo, hi)`` of tile ``[r0, r1) x [c0, c1)`` whose positive lies in it, and
        the tile's diagonal offset ``k`` that holds them (``tile.diagonal(k)``)."""
        lo, hi = max(r0, c0 - self.offset), min(r1, c1 - self.offset)
        return lo, max(lo, hi), self.offset + r0 - c0

    def excluded(self, r0: int, r1: int, c0: int, c1: int, out: Tensor) -> Tensor | None:
        """``(r1 - r0, c1 - c0)`` bool in ``out``, True where ``L[i, j]`` is not a candidate;
        None when every entry of the tile is one."""
        lo, hi, k = self.positives(r0, r1, c0, c1)
        if self.dense is not None:
            torch.logical_not(self.dense[r0:r1, c0:c1], out=out)
        elif self.tile_mask is not None:
            assert self.anchor_index is not None and self.candidate_index is not None
            tile = self.tile_mask.mask(self.anchor_index[r0:r1], self.candidate_index[c0:c1])
            shape = (r1 - r0, c1 - c0)
            if not isinstance(tile, Tensor) or tile.dtype != torch.bool or tile.shape != shape:
                raise CrlValueError(
                    f"TileMask.mask: must return a bool tensor of shape {shape} for "
                    f"{shape[0]} anchors and {shape[1]} candidates; got {describe(tile)}")
            torch.logical_not(tile.to(out.device), out=out)
        elif hi > lo and not self.include_positive:
            out.zero_()
        else:
            return None
        if hi > lo:
            out.diagonal(k).fill_(not self.include_positive)
        return out
