"""Exact InfoNCE / CLIP losses over tiles of the score matrix, in ``O(B·D + T²)`` memory.

The plain losses build the ``(B, B)`` logits ``L = scale * a @ b.T`` and run softmax and
cross-entropy over it, which costs ``B²`` memory and several ``B²`` passes. Here ``L`` is visited
in ``T x T`` tiles and never stored (the idea of Inf-CL, Cheng et al. 2024, which is CUDA-only;
this version is plain torch and runs on every device):

- **forward**: one pass over the tiles; each tile's row and column log-sum-exps are merged into
  running ones with ``logaddexp`` (both directions of the symmetric loss from the same tile), and
  the diagonal tiles give the positive logits ``L_ii``;
- **backward**: each tile is recomputed, ``P_row = exp(L - lse_row)``, ``P_col = exp(L - lse_col)``,
  ``G = g_row * P_row + g_col * P_col`` (``g_*`` the incoming gradients of the log-sum-exps), and
  ``grad_a += scale * G @ b_tile``, ``grad_b += G.T @ (scale * a_tile)``,
  ``grad_scale = sum_ij G_ij s_ij = sum_i a_i . (G @ b)_i``.

That is ``8 B² D`` flops for a forward and backward (the ``a @ b.T`` product twice, plus the two
gradient products) and three ``(T, T)`` buffers. One ``exp`` per entry and pass serves both
directions: the column sums of the forward are the product ``exp(L - m_row).T @ exp(m_row - K)``,
and the backward's ``P_col`` is ``P_row * exp(lse_row_i - lse_col_j)``, wherever that is exact
in the dtype (tiles whose log-sum-exps span more, e.g. at very low temperature, take a second
``exp``). The results equal the plain losses of :mod:`crl.losses.infonce` up to floating-point
rounding (THEORY.md section 1).

Negatives masks come as a dense ``(B, B)`` bool tensor (sliced per tile) or as a :class:`TileMask`,
an object whose ``mask(rows_index, cols_index)`` returns the ``(T, T)`` mask of one tile from the
samples' dataset indices (such as :class:`crl.negatives.NegativeSets`), so no ``B²`` object is
ever built.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol, cast, runtime_checkable

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from crl._validation import (
    check_int_range,
    check_mask,
    check_pair,
    check_positive,
    check_tensor,
    compute_dtype,
    describe,
    upcast,
)
from crl.errors import CrlTypeError, CrlValueError
from crl.losses._common import masked_logsumexp

#: Tile side used when ``block_size`` is None. Three ``(T, T)`` buffers (192 MiB in float32):
#: the ``(T, D) @ (D, T)`` products run at full speed and there are few tiles, so few thread-pool
#: synchronisations; on 2 shared CPU cores 4096 ran 1.3-1.9x faster than 2048 at B = 16,384.
DEFAULT_BLOCK_SIZE = 4096
#: ``info_nce``/``clip_loss`` with ``block_size=None`` use the plain ``(B, B)`` path up to this
#: batch size and tiles above it (measured: tiles win from about ``B = 2048`` on CPU).
PLAIN_MAX_BATCH = 2048


#: A :class:`TileMask` block of at most this many entries (64 MiB of bool) is evaluated once
#: per call, in row chunks, and kept dense (:func:`densify`): the two directions of a loss and
#: the backward pass then read it instead of asking the mask again for every tile and pass.
DENSE_MASK_MAX_ENTRIES = 1 << 26


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


def densify(mask: TileMask, rows_index: Tensor, cols_index: Tensor, *,
            max_entries: int | None = None) -> Tensor | TileMask:
    """The ``(h, W)`` bool block ``mask.mask(rows_index, cols_index)`` when it has at most
    ``max_entries`` entries (default :data:`DENSE_MASK_MAX_ENTRIES`; computed in row chunks of
    about 4M entries), else ``mask`` itself.

    Example:
        >>> from crl.negatives import NegativeSets
        >>> sets = NegativeSets(100, 10, regime="independent", seed=0)
        >>> block = densify(sets, torch.arange(3), torch.arange(100))
        >>> tuple(block.shape), block.sum(dim=1).tolist()
        ((3, 100), [10, 10, 10])
        >>> densify(sets, torch.arange(3), torch.arange(100), max_entries=10) is sets
        True
    """
    h, width = rows_index.numel(), cols_index.numel()
    if h * width > (DENSE_MASK_MAX_ENTRIES if max_entries is None else max_entries):
        return mask
    step = max(1, (1 << 22) // max(width, 1))
    return torch.cat([mask.mask(rows_index[i:i + step], cols_index)
                      for i in range(0, max(h, 1), step)]) if h else \
        torch.zeros(0, width, dtype=torch.bool, device=rows_index.device)


class NegativeLogSumExp(NamedTuple):
    """Per-anchor log-sum-exps over the negatives, from :func:`tiled_masked_row_logsumexp`.

    Attributes:
        rows: ``(B,)``: ``log sum_{j in neg(i)} exp(scale_i (s_ij - s_ii))`` (``-inf`` for an
            anchor with no negative), differentiable in ``a``, ``b`` and ``scale``.
        row_counts: ``(B,)`` int64: ``|neg(i)|``.
        cols: ``(B,)`` or None: the other direction, ``log sum_{i in neg(j)^T} exp(scale
            (s_ij - s_jj))`` for candidate ``j`` as the anchor (``columns=True`` only).
        col_counts: ``(B,)`` int64 or None: ``|{i : j in neg(i)}|``.
    """

    rows: Tensor
    row_counts: Tensor
    cols: Tensor | None
    col_counts: Tensor | None


def _spans(total: int, block: int) -> Iterator[tuple[int, int]]:
    for start in range(0, total, block):
        yield start, min(start + block, total)


class _MaskTiles:
    """Where each tile's mask comes from: nothing, a dense ``(h, W)`` bool, or a :class:`TileMask`.

    Anchor (row) ``i``'s positive is candidate (column) ``offset + i``: the diagonal of a square
    batch (``offset = 0``), or the columns of a rank's own rows among all-gathered ones.
    ``include_positive`` says whether that entry is a candidate (InfoNCE) or not (the
    negatives-only log-sum-exp of GCL); whatever the mask says about it is overridden.
    ``index`` / ``cols_index`` are the dataset indices of rows / columns for a :class:`TileMask`.
    """

    def __init__(self, dense: Tensor | None, tile_mask: TileMask | None, index: Tensor | None,
                 include_positive: bool, *, offset: int = 0,
                 cols_index: Tensor | None = None) -> None:
        self.dense = dense
        self.tile_mask = tile_mask
        self.index = index
        self.cols_index = index if cols_index is None else cols_index
        self.include_positive = include_positive
        self.offset = offset

    @property
    def trivial(self) -> bool:
        """True when no tile has an excluded entry (no mask, positive included)."""
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
            assert self.index is not None and self.cols_index is not None
            tile = self.tile_mask.mask(self.index[r0:r1], self.cols_index[c0:c1])
            shape = (r1 - r0, c1 - c0)
            if not isinstance(tile, Tensor) or tile.dtype != torch.bool or tile.shape != shape:
                raise CrlValueError(
                    f"TileMask.mask: must return a bool tensor of shape {shape} for "
                    f"{shape[0]} anchors and {shape[1]} candidates; got {describe(tile)}"
                )
            torch.logical_not(tile.to(out.device), out=out)
        elif hi > lo and not self.include_positive:
            out.zero_()
        else:
            return None
        if hi > lo:
            out.diagonal(k).fill_(not self.include_positive)
        return out


def _exp_floor(dtype: torch.dtype) -> float:
    """The smallest ``x`` whose ``exp(x)`` is a normal number of ``dtype``.

    Arguments of ``exp`` are clamped to it: an ``exp`` that underflows to a subnormal or to 0 is
    several times slower on CPUs, and a term below ``exp(floor)`` (``1e-38`` in float32) next to
    the largest term ``exp(0) = 1`` of a max-shifted sum changes nothing at the dtype's precision.
    """
    return math.log(torch.finfo(dtype).tiny) + 0.5


def _precision_margin(dtype: torch.dtype, terms: int) -> float:
    """``log(4 n / eps)``: terms below ``exp(-margin)`` times the total, ``n`` of them, change a
    sum by less than a quarter of the dtype's ``eps`` relative."""
    return math.log(4.0 * max(terms, 1) / torch.finfo(dtype).eps)


def _tile_logsumexps(x: Tensor, work: Tensor, want_cols: bool) -> tuple[Tensor, Tensor | None]:
    """Row and (optionally) column log-sum-exps of a tile ``x (h, w)`` with one ``exp`` per entry.

    ``E = exp(x - m_row)`` gives the rows. The columns reuse it: ``sum_i exp(x_ij - K) =
    sum_i E_ij exp(m_i - K)`` (``K`` the tile's max) is the product ``E.T @ exp(m - K)``. Every
    ``exp`` argument is clamped at the floor, so that product is exact except for a column whose
    sum is within ``exp(margin)`` of the floor's scale; those few columns (far below the tile's
    max, e.g. at very low temperature) are recomputed directly. ``-inf`` marks a line of ``x``
    that is all ``-inf``; ``work`` is scratch of ``x``'s shape.
    """
    floor = _exp_floor(x.dtype)
    peak = x.amax(dim=1, keepdim=True)  # (h, 1)
    empty = torch.isneginf(peak)
    safe_peak = peak.masked_fill(empty, 0.0)
    e = torch.sub(x, safe_peak, out=work).clamp_(min=floor).exp_()  # (h, w)
    rows = e.sum(dim=1, keepdim=True).log_().add_(safe_peak).masked_fill_(empty, -math.inf)
    if not want_cols:
        return rows.squeeze(1), None
    top = peak.max()
    if bool(torch.isneginf(top)):
        return rows.squeeze(1), x.new_full((x.shape[1],), -math.inf)
    weights = (peak - top).clamp_(min=floor).exp_().masked_fill_(empty, 0.0)  # (h, 1)
    cols = torch.mv(e.T, weights.squeeze(1)).log_().add_(top)  # (w,)
    low = cols < top + floor + _precision_margin(x.dtype, 2 * x.shape[0])
    if bool(low.any()):
        where_low = low.nonzero().squeeze(1)
        cols[where_low] = torch.logsumexp(x[:, where_low], dim=0)
    return rows.squeeze(1), cols


def _block_bounds(lse_rows: Tensor, lse_cols: Tensor | None, block: int
                  ) -> tuple[list[float], list[float], list[float], list[float]] | None:
    """Per block of ``block`` rows (columns): the min and max of the row (column) log-sum-exps,
    as ``(row_min, row_max, col_min, col_max)`` lists; None without columns."""
    if lse_cols is None:
        return None
    cols = lse_cols.reshape(-1)
    n = lse_rows.shape[0]
    pad = (-n) % block

    def minmax(x: Tensor) -> tuple[list[float], list[float]]:
        lo = torch.cat([x, x.new_full((pad,), math.inf)]).view(-1, block).amin(dim=1)
        hi = torch.cat([x, x.new_full((pad,), -math.inf)]).view(-1, block).amax(dim=1)
        return lo.tolist(), hi.tolist()

    rows_lo, rows_hi = minmax(lse_rows)
    cols_lo, cols_hi = minmax(cols)
    return rows_lo, rows_hi, cols_lo, cols_hi


def _span(bounds: tuple[list[float], list[float], list[float], list[float]], bi: int,
          bj: int) -> float:
    """The width of the interval that holds row block ``bi``'s and column block ``bj``'s
    log-sum-exps."""
    rows_lo, rows_hi, cols_lo, cols_hi = bounds
    return max(rows_hi[bi], cols_hi[bj]) - min(rows_lo[bi], cols_lo[bj])


def _scaled(a: Tensor, scale: Tensor) -> Tensor:
    """``scale * a`` for a 0-dim or a per-row ``(B,)`` scale."""
    return a * (scale.unsqueeze(1) if scale.dim() == 1 else scale)


class _TiledLogSumExp(torch.autograd.Function):
    """Row and column log-sum-exps (over candidates) and the positives of ``L = scale * a @ b.T``.

    ``a (h, D)`` are anchors, ``b (W, D)`` candidates, and row ``i``'s positive is
    ``L[i, tiles.offset + i]`` (the diagonal when ``h = W`` and the offset is 0). Outputs
    ``lse_rows (h,)``, ``lse_cols (W,)`` (empty unless ``want_cols``, which needs a square ``L``
    with offset 0), ``diagonal (h,)`` (the positives) and the candidate counts of rows ``(h,)``
    and columns ``(W,)`` int64 (not differentiable).
    """

    @staticmethod
    def forward(ctx: FunctionCtx, a: Tensor, b: Tensor, scale: Tensor, block: int,
                tiles: _MaskTiles, want_cols: bool) -> tuple[Tensor, ...]:
        n_rows, n_cols = a.shape[0], b.shape[0]
        a_s = _scaled(a, scale)  # (h, D)
        lse_rows = a.new_full((n_rows,), -math.inf)
        lse_cols = a.new_full((n_cols,), -math.inf) if want_cols else a.new_empty(0)
        diagonal = a.new_empty(n_rows)
        count_rows = torch.zeros(n_rows, dtype=torch.int64, device=a.device)
        count_cols = torch.zeros(n_cols, dtype=torch.int64, device=a.device)
        logits_buf = a.new_empty(block * block)
        work_buf = a.new_empty(block * block)
        excluded_buf = torch.empty(block * block, dtype=torch.bool, device=a.device)
        for r0, r1 in _spans(n_rows, block):
            for c0, c1 in _spans(n_cols, block):
                h, w = r1 - r0, c1 - c0
                logits = torch.mm(a_s[r0:r1], b[c0:c1].T,
                                  out=logits_buf[: h * w].view(h, w))  # (h, w)
                lo, hi, k = tiles.positives(r0, r1, c0, c1)
                if hi > lo:
                    diagonal[lo:hi] = logits.diagonal(k)
                excluded = tiles.excluded(r0, r1, c0, c1, excluded_buf[: h * w].view(h, w))
                if excluded is None:
                    count_rows[r0:r1] += w
                    count_cols[c0:c1] += h
                else:
                    logits.masked_fill_(excluded, -math.inf)
                    count_rows[r0:r1] += w - excluded.sum(dim=1)
                    count_cols[c0:c1] += h - excluded.sum(dim=0)
                tile_rows, tile_cols = _tile_logsumexps(
                    logits, work_buf[: h * w].view(h, w), want_cols)
                part = lse_rows[r0:r1]
                torch.logaddexp(part, tile_rows, out=part)
                if tile_cols is not None:
                    part = lse_cols[c0:c1]
                    torch.logaddexp(part, tile_cols, out=part)
        ctx.save_for_backward(a, b, scale, lse_rows, lse_cols)
        ctx.block = block  # type: ignore[attr-defined]
        ctx.tiles = tiles  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(count_rows, count_cols)
        ctx.set_materialize_grads(False)
        return lse_rows, lse_cols, diagonal, count_rows, count_cols

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_rows: Tensor | None, grad_cols: Tensor | None,
                 grad_diagonal: Tensor | None, *_: Any) -> tuple[Tensor | None, ...]:
        a, b, scale, lse_rows, lse_cols = ctx.saved_tensors
        block: int = ctx.block
        tiles: _MaskTiles = ctx.tiles
        need_a, need_b, need_scale = ctx.needs_input_grad[:3]
        want_a = need_a or need_scale  # grad_scale is read off the grad_a accumulator
        n_rows, n_cols = a.shape[0], b.shape[0]
        a_s = _scaled(a, scale)  # (h, D)
        acc_a = torch.zeros_like(a)  # sum_j G_ij b_j
        acc_b = torch.zeros_like(b)  # sum_i G_ij scale_i a_i
        if grad_cols is not None and lse_cols.numel() == 0:
            grad_cols = None
        if grad_rows is not None or grad_cols is not None:
            # A row with no candidate has lse = -inf and only -inf logits: shift it by 0 instead.
            shift_rows = torch.nan_to_num(lse_rows, neginf=0.0).unsqueeze(1)  # (B, 1)
            shift_cols = (torch.nan_to_num(lse_cols, neginf=0.0).unsqueeze(0)
                          if grad_cols is not None else None)  # (1, B)
            floor = _exp_floor(a.dtype)
            # Both directions from one exp: P_col = P_row * exp(lse_row_i - lse_col_j). When a
            # tile's log-sum-exps span at most `window`, exp(lse_row_i - low) and
            # exp(low - lse_col_j) neither overflow nor underflow, and a P_row clamped at the
            # floor stands for a P_col below eps / (4 B): negligible. Other tiles take two exps.
            window = -floor - _precision_margin(a.dtype, 4 * max(n_rows, n_cols))
            bounds = _block_bounds(shift_rows.squeeze(1), shift_cols, block)
            logits_buf = a.new_empty(block * block)
            grad_buf = a.new_empty(block * block)
            excluded_buf = torch.empty(block * block, dtype=torch.bool, device=a.device)
            for r0, r1 in _spans(n_rows, block):
                for c0, c1 in _spans(n_cols, block):
                    h, w = r1 - r0, c1 - c0
                    logits = torch.mm(a_s[r0:r1], b[c0:c1].T,
                                      out=logits_buf[: h * w].view(h, w))  # (h, w)
                    excluded = tiles.excluded(r0, r1, c0, c1, excluded_buf[: h * w].view(h, w))
                    if excluded is not None:
                        logits.masked_fill_(excluded, -math.inf)
                    g = grad_buf[: h * w].view(h, w)
                    if (grad_rows is not None and shift_cols is not None
                            and grad_cols is not None and bounds is not None
                            and _span(bounds, r0 // block, c0 // block) <= window):
                        low = min(bounds[0][r0 // block], bounds[2][c0 // block])
                        torch.sub(logits, shift_rows[r0:r1], out=g)
                        g.clamp_(min=floor).exp_()  # P_row
                        u = (shift_rows[r0:r1, 0] - low).exp_()  # (h,) in [1, e^window]
                        t = (low - shift_cols[0, c0:c1]).exp_().mul_(grad_cols[c0:c1])  # (w,)
                        # G = P_row * (g_row_i + g_col_j exp(lse_row_i - lse_col_j))
                        factor = torch.addr(grad_rows[r0:r1].unsqueeze(1), u, t, out=logits)
                        g.mul_(factor)
                    elif grad_rows is not None:
                        torch.sub(logits, shift_rows[r0:r1], out=g)
                        g.clamp_(min=floor).exp_()  # P_row
                        g.mul_(grad_rows[r0:r1].unsqueeze(1))
                        if shift_cols is not None and grad_cols is not None:
                            p_col = logits.sub_(shift_cols[:, c0:c1]).clamp_(min=floor).exp_()
                            g.addcmul_(p_col, grad_cols[c0:c1].unsqueeze(0))
                    elif shift_cols is not None and grad_cols is not None:
                        torch.sub(logits, shift_cols[:, c0:c1], out=g)
                        g.clamp_(min=floor).exp_().mul_(grad_cols[c0:c1].unsqueeze(0))  # P_col
                    if want_a:
                        acc_a[r0:r1].addmm_(g, b[c0:c1])
                    if need_b:
                        acc_b[c0:c1].addmm_(g.T, a_s[r0:r1])
        if grad_diagonal is not None:
            own = slice(tiles.offset, tiles.offset + n_rows)  # the rows' positives
            acc_a.addcmul_(grad_diagonal.unsqueeze(1), b[own])
            acc_b[own].addcmul_(grad_diagonal.unsqueeze(1), a_s)
        grad_a = _scaled(acc_a, scale) if need_a else None
        grad_b = acc_b if need_b else None
        grad_scale = None
        if need_scale:
            grad_scale = (a * acc_a).sum(dim=1) if scale.dim() == 1 else (a * acc_a).sum()
        return grad_a, grad_b, grad_scale, None, None, None


def _tiled_logsumexp(a: Tensor, b: Tensor, scale: Tensor, block: int, tiles: _MaskTiles,
                     want_cols: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Typed entry to :class:`_TiledLogSumExp`: ``(lse_rows, lse_cols, diagonal, count_rows,
    count_cols)``."""
    out = _TiledLogSumExp.apply(a, b, scale, block, tiles, want_cols)  # type: ignore[no-untyped-call]
    return cast(tuple[Tensor, Tensor, Tensor, Tensor, Tensor], out)


def resolve_block_size(where: str, block_size: int | None, batch: int) -> int:
    """The tile side to use for a batch of ``batch``: ``block_size`` checked (an int >= 1),
    or :data:`DEFAULT_BLOCK_SIZE` when None; never more than ``batch``."""
    if block_size is None:
        return max(1, min(DEFAULT_BLOCK_SIZE, batch))
    check_int_range(where, "block_size", block_size, 1, None)
    return min(block_size, batch)


def use_tiles(where: str, a: object, block_size: int | None) -> bool:
    """Whether ``info_nce``/``clip_loss`` take the tiled path: always for an int ``block_size``
    (checked here), and for None when the batch has more than :data:`PLAIN_MAX_BATCH` rows."""
    if block_size is not None:
        check_int_range(where, "block_size", block_size, 1, None)
        return True
    return isinstance(a, Tensor) and a.dim() == 2 and a.shape[0] > PLAIN_MAX_BATCH


def _check_index(where: str, index: object, batch: int, device: torch.device) -> Tensor:
    if not isinstance(index, Tensor):
        raise CrlTypeError(f"{where}: `index` must be a torch.Tensor; got {describe(index)}")
    if index.dtype in (torch.bool,) or index.is_floating_point() or index.is_complex():
        raise CrlTypeError(f"{where}: `index` must have an integer dtype; got {index.dtype}")
    if tuple(index.shape) != (batch,):
        raise CrlValueError(
            f"{where}: `index` must have shape ({batch},) (one dataset index per pair); "
            f"got {tuple(index.shape)}"
        )
    return index.to(device)


def mask_tiles(where: str, negatives_mask: Tensor | TileMask | None, index: Tensor | None,
               batch: int, device: torch.device, *, include_positive: bool,
               require_negatives: bool) -> _MaskTiles:
    """Check a negatives mask (dense, :class:`TileMask` or None) and wrap it for the tiles.

    ``index`` (the ``(B,)`` dataset indices) is used by a :class:`TileMask` only; it defaults to
    ``arange(B)``. A dense mask is checked here (every row needs a negative when
    ``require_negatives``); a :class:`TileMask`'s rows are counted during the forward pass.
    """
    if index is not None:
        index = _check_index(where, index, batch, device)
    if negatives_mask is None:
        return _MaskTiles(None, None, None, include_positive)
    if isinstance(negatives_mask, Tensor):
        dense = check_mask(where, "negatives_mask", negatives_mask, (batch, batch),
                           need_true_per_row=require_negatives, ignore_diagonal=True)
        return _MaskTiles(dense.to(device), None, None, include_positive)
    if isinstance(negatives_mask, TileMask):
        if index is None:
            index = torch.arange(batch, device=device)
        return _MaskTiles(None, negatives_mask, index, include_positive)
    raise CrlTypeError(
        f"{where}: `negatives_mask` must be None, a (B, B) bool tensor or an object with a "
        f"`mask(rows_index, cols_index)` method (a TileMask); got {describe(negatives_mask)}"
    )


def dense_mask(where: str, negatives_mask: Tensor | TileMask | None, index: Tensor | None,
               batch: int, device: torch.device) -> Tensor | None:
    """A :class:`TileMask` as the dense ``(B, B)`` mask of the batch (for the plain path)."""
    if not isinstance(negatives_mask, Tensor) and isinstance(negatives_mask, TileMask):
        rows = (_check_index(where, index, batch, device) if index is not None
                else torch.arange(batch, device=device))
        return negatives_mask.mask(rows, rows)
    if index is not None:
        _check_index(where, index, batch, device)
    return negatives_mask


def _check_row_counts(where: str, count_rows: Tensor) -> None:
    """Every anchor needs a negative (the counts include the positive, hence ``< 2``)."""
    empty = (count_rows < 2).nonzero().flatten()
    if empty.numel() > 0:
        first = [int(i) for i in empty[:5]]
        raise CrlValueError(
            f"{where}: every row of `negatives_mask` needs at least one negative; "
            f"{empty.numel()} row(s) have none (first: {first})"
        )


def _scale_tensor(where: str, name: str, value: float | Tensor, dtype: torch.dtype,
                  device: torch.device) -> Tensor:
    check_positive(where, name, value)
    if isinstance(value, Tensor):
        return upcast(value.reshape(()), dtype).to(device)
    return torch.tensor(float(value), dtype=dtype, device=device)


def _tiled_loss(where: str, a: Tensor, b: Tensor, scale: Tensor, symmetric: bool,
                tiles: _MaskTiles, block: int, check_rows: bool) -> Tensor:
    lse_rows, lse_cols, diagonal, count_rows, _ = _tiled_logsumexp(
        a, b, scale, block, tiles, symmetric)
    if check_rows:
        _check_row_counts(where, count_rows)
    loss = (lse_rows - diagonal).mean()
    if symmetric:
        loss = 0.5 * (loss + (lse_cols - diagonal).mean())
    return loss


def tiled_info_nce(
    a: Tensor,
    b: Tensor,
    *,
    temperature: float | Tensor = 0.07,
    symmetric: bool = False,
    negatives_mask: Tensor | TileMask | None = None,
    index: Tensor | None = None,
    block_size: int | None = None,
) -> Tensor:
    """:func:`~crl.losses.info_nce` computed over ``T x T`` tiles: same value and gradients,
    ``O(B·D + T²)`` memory.

    Args:
        a: Anchors ``(B, D)``.
        b: Positives ``(B, D)``; ``b[i]`` is the positive of ``a[i]``.
        temperature: ``tau > 0``, a number or a 0-dim tensor (may require grad).
        symmetric: If True, the mean of the ``a -> b`` and ``b -> a`` directions (the second
            uses the transposed mask).
        negatives_mask: None (every ``j != i``), a ``(B, B)`` bool tensor, or a
            :class:`TileMask` asked for one tile at a time. The diagonal is ignored; every anchor
            needs a negative.
        index: ``(B,)`` dataset indices of the pairs, passed to a :class:`TileMask` (default
            ``arange(B)``); unused otherwise.
        block_size: Tile side ``T`` (default :data:`DEFAULT_BLOCK_SIZE`, at most ``B``).

    Returns:
        0-dim tensor: the mean loss over anchors.

    Raises:
        CrlValueError: as :func:`~crl.losses.info_nce`, and for ``block_size < 1``.
        CrlTypeError: for a non-integer ``block_size`` or an unusable ``negatives_mask``.

    Example:
        >>> from crl.losses import info_nce
        >>> a, b = torch.randn(10, 4, dtype=torch.float64), torch.randn(10, 4, dtype=torch.float64)
        >>> tiled = tiled_info_nce(a, b, temperature=0.1, symmetric=True, block_size=3)
        >>> bool(torch.allclose(tiled, info_nce(a, b, temperature=0.1, symmetric=True)))
        True
    """
    where = "tiled_info_nce"
    a, b = check_pair(where, a, b)
    dtype = compute_dtype(a, b)
    a, b = upcast(a, dtype), upcast(b, dtype)
    scale = 1.0 / _scale_tensor(where, "temperature", temperature, dtype, a.device)
    batch = a.shape[0]
    block = resolve_block_size(where, block_size, batch)
    tiles = mask_tiles(where, negatives_mask, index, batch, a.device, include_positive=True,
                       require_negatives=True)
    return _tiled_loss(where, a, b, scale, symmetric, tiles, block,
                       check_rows=tiles.tile_mask is not None)


def tiled_clip_loss(a: Tensor, b: Tensor, scale: float | Tensor, *,
                    block_size: int | None = None) -> Tensor:
    """:func:`~crl.losses.clip_loss` (open_clip's ``ClipLoss``) computed over ``T x T`` tiles.

    ``(CE(scale * a @ b.T, arange(B)) + CE(scale * b @ a.T, arange(B))) / 2`` in
    ``O(B·D + T²)`` memory; equal to the plain loss, value and gradients (``scale`` included).

    Args:
        a: Image (or view-a) embeddings ``(B, D)``.
        b: Text (or view-b) embeddings ``(B, D)``.
        scale: ``exp(logit_scale) = 1 / tau``, a positive number or 0-dim tensor (may require
            grad).
        block_size: Tile side ``T`` (default :data:`DEFAULT_BLOCK_SIZE`, at most ``B``).

    Returns:
        0-dim tensor.

    Raises:
        CrlValueError: on shape mismatch, ``B < 2``, NaN/Inf, ``scale <= 0``, ``block_size < 1``.

    Example:
        >>> a = torch.eye(3)
        >>> round(float(tiled_clip_loss(a, a, 1.0, block_size=2)), 4)  # log(e + 2) - 1
        0.5514
    """
    where = "tiled_clip_loss"
    a, b = check_pair(where, a, b)
    dtype = compute_dtype(a, b)
    a, b = upcast(a, dtype), upcast(b, dtype)
    scale_t = _scale_tensor(where, "scale", scale, dtype, a.device)
    block = resolve_block_size(where, block_size, a.shape[0])
    tiles = _MaskTiles(None, None, None, include_positive=True)
    return _tiled_loss(where, a, b, scale_t, True, tiles, block, check_rows=False)


def tiled_masked_row_logsumexp(
    a: Tensor,
    b: Tensor,
    scale: float | Tensor,
    *,
    negatives_mask: Tensor | TileMask | None = None,
    index: Tensor | None = None,
    columns: bool = False,
    block_size: int | None = None,
) -> NegativeLogSumExp:
    """``log sum_{j in neg(i)} exp(scale_i (s_ij - s_ii))`` per anchor, over tiles of ``s``.

    The negatives-only log-sum-exp of the global contrastive loss (THEORY.md section 3):
    ``log g_hat_i = rows[i] - log row_counts[i]`` with ``scale = 1 / tau``. Memory
    ``O(B·D + T²)``; gradients flow to ``a``, ``b`` and ``scale``.

    Args:
        a: Anchors ``(B, D)``.
        b: Candidates ``(B, D)``; ``b[i]`` is the positive of ``a[i]`` (never a negative).
        scale: ``1 / tau``: a positive number, a 0-dim tensor, or a ``(B,)`` tensor of
            per-anchor scales (then ``columns`` must be False); tensors may require grad.
        negatives_mask: None (every ``j != i``), a ``(B, B)`` bool tensor or a
            :class:`TileMask`; rows may be empty (their entry is ``-inf``, their count 0).
        index: ``(B,)`` dataset indices, passed to a :class:`TileMask` (default ``arange(B)``).
        columns: Also compute the other direction (candidate ``j`` as the anchor, the
            transposed mask) from the same tiles.
        block_size: Tile side ``T`` (default :data:`DEFAULT_BLOCK_SIZE`).

    Returns:
        :class:`NegativeLogSumExp` ``(rows, row_counts, cols, col_counts)``.

    Raises:
        CrlValueError / CrlTypeError: on bad shapes, NaN/Inf, a non-positive scale, a bad mask,
            index or ``block_size``.

    Example:
        >>> a = torch.eye(3)
        >>> out = tiled_masked_row_logsumexp(a, a, 1.0, block_size=2)
        >>> [round(v, 4) for v in out.rows.tolist()], out.row_counts.tolist()  # log(2 e^-1)
        ([-0.3069, -0.3069, -0.3069], [2, 2, 2])
    """
    where = "tiled_masked_row_logsumexp"
    a, b = check_pair(where, a, b, min_rows=1)
    dtype = compute_dtype(a, b)
    a, b = upcast(a, dtype), upcast(b, dtype)
    batch = a.shape[0]
    if isinstance(scale, Tensor) and scale.dim() == 1:
        scale_t = upcast(check_tensor(where, "scale", scale, ndim=1), dtype).to(a.device)
        if scale_t.shape[0] != batch or not bool((scale_t > 0).all()):
            raise CrlValueError(
                f"{where}: a 1-D `scale` must have shape ({batch},) and positive entries; "
                f"got {describe(scale)}"
            )
        if columns:
            raise CrlValueError(
                f"{where}: `columns=True` needs one scale for both directions; got a per-anchor "
                f"`scale` of shape {tuple(scale.shape)} (call again with (b, a) instead)"
            )
    else:
        scale_t = _scale_tensor(where, "scale", scale, dtype, a.device)
    block = resolve_block_size(where, block_size, batch)
    tiles = mask_tiles(where, negatives_mask, index, batch, a.device, include_positive=False,
                       require_negatives=False)
    lse_rows, lse_cols, diagonal, count_rows, count_cols = _tiled_logsumexp(
        a, b, scale_t, block, tiles, columns)
    if not columns:
        return NegativeLogSumExp(lse_rows - diagonal, count_rows, None, None)
    return NegativeLogSumExp(lse_rows - diagonal, count_rows, lse_cols - diagonal, count_cols)


class AnchorLogSumExp(NamedTuple):
    """Per-anchor log-sum-exps of anchors against candidates, from :func:`anchor_logsumexp`.

    Attributes:
        lse: ``(h,)``: ``log sum_{j in C(i)} exp(L_ij)`` over anchor ``i``'s candidates ``C(i)``
            (``-inf`` and no gradient for an anchor with none), ``L = scale * anchors @
            candidates.T``.
        positive: ``(h,)``: ``L[i, offset + i]``, the logit of anchor ``i``'s positive.
        counts: ``(h,)`` int64: ``|C(i)|``.
    """

    lse: Tensor
    positive: Tensor
    counts: Tensor


def anchor_logsumexp(
    anchors: Tensor,
    candidates: Tensor,
    scale: float | Tensor,
    *,
    offset: int = 0,
    include_positive: bool = True,
    negatives_mask: Tensor | TileMask | None = None,
    anchor_index: Tensor | None = None,
    candidate_index: Tensor | None = None,
    block_size: int | None = None,
) -> AnchorLogSumExp:
    """Log-sum-exps of some anchors against all candidates, the positive of anchor ``i`` being
    candidate ``offset + i``: the local rows of a distributed batch against the gathered columns.

    With ``L = scale * anchors @ candidates.T`` ``(h, W)``, anchor ``i``'s candidates ``C(i)``
    are its negatives (``negatives_mask``, default every column but its positive) plus, when
    ``include_positive``, its positive. InfoNCE of anchor ``i`` is ``lse[i] - positive[i]``;
    GCL's ``log g_hat_i`` is ``lse[i] - positive[i] - log counts[i]`` with
    ``include_positive=False``. In a process group of ``N`` ranks with ``h = B / N`` local rows,
    rank ``r`` passes its rows, all gathered columns and ``offset = r * h``.

    Small problems (``h * W <= PLAIN_MAX_BATCH²`` and no ``block_size``) build ``L``; larger ones
    (or any ``block_size``) visit it in ``T x T`` tiles in ``O((h + W) D + T²)`` memory, with the
    same values and gradients.

    Args:
        anchors: ``(h, D)``.
        candidates: ``(W, D)``, ``W >= offset + h``.
        scale: ``1 / tau``: a positive number, a 0-dim tensor or an ``(h,)`` tensor of per-anchor
            scales; tensors may require grad.
        offset: Column of anchor 0's positive.
        include_positive: Count the positive among the candidates (InfoNCE) or not (GCL).
        negatives_mask: None, an ``(h, W)`` bool tensor (``[i, j]``: candidate ``j`` is a
            negative of anchor ``i``), or a :class:`TileMask` asked with ``anchor_index`` and
            ``candidate_index``. The positive's entry is ignored.
        anchor_index: ``(h,)`` dataset indices of the anchors for a :class:`TileMask`
            (default ``arange(offset, offset + h)``).
        candidate_index: ``(W,)`` dataset indices of the candidates (default ``arange(W)``).
        block_size: Tile side ``T``; None: tiles only for large problems.

    Returns:
        :class:`AnchorLogSumExp` ``(lse, positive, counts)``.

    Raises:
        CrlValueError / CrlTypeError: on bad shapes, NaN/Inf, a non-positive scale, an offset
            that puts a positive outside the candidates, a bad mask, index or ``block_size``.

    Example:
        >>> anchors, candidates = torch.eye(4)[2:], torch.eye(4)  # rows 2 and 3 of a batch of 4
        >>> out = anchor_logsumexp(anchors, candidates, 1.0, offset=2)
        >>> out.positive.tolist(), out.counts.tolist()
        ([1.0, 1.0], [4, 4])
        >>> round(float(out.lse[0] - out.positive[0]), 4)  # InfoNCE: log(e + 3) - 1
        0.7437
    """
    where = "anchor_logsumexp"
    anchors = check_tensor(where, "anchors", anchors, ndim=2)
    candidates = check_tensor(where, "candidates", candidates, ndim=2)
    h, width = anchors.shape[0], candidates.shape[0]
    if anchors.shape[1] != candidates.shape[1] or anchors.device != candidates.device:
        raise CrlValueError(
            f"{where}: `anchors` and `candidates` must have the same width D and device; got "
            f"{describe(anchors)} and {describe(candidates)}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 \
            or offset + h > width or h == 0:
        raise CrlValueError(
            f"{where}: `offset` must be an int in [0, W - h] = [0, {width - h}] so that every "
            f"anchor's positive (column offset + i) is a candidate, with h >= 1; got "
            f"offset={offset!r} for h = {h} anchors and W = {width} candidates")
    dtype = compute_dtype(anchors, candidates)
    anchors, candidates = upcast(anchors, dtype), upcast(candidates, dtype)
    if isinstance(scale, Tensor) and scale.dim() == 1:
        scale_t = upcast(check_tensor(where, "scale", scale, ndim=1), dtype).to(anchors.device)
        if scale_t.shape[0] != h or not bool((scale_t > 0).all()):
            raise CrlValueError(f"{where}: a 1-D `scale` must have shape ({h},) and positive "
                                f"entries; got {describe(scale)}")
    else:
        scale_t = _scale_tensor(where, "scale", scale, dtype, anchors.device)
    device = anchors.device
    rows_index = cols_index = None
    if isinstance(negatives_mask, Tensor):
        negatives_mask = check_mask(where, "negatives_mask", negatives_mask, (h, width),
                                    need_true_per_row=False).to(device)
    elif negatives_mask is not None:
        if not isinstance(negatives_mask, TileMask):
            raise CrlTypeError(
                f"{where}: `negatives_mask` must be None, an (h, W) bool tensor or a TileMask; "
                f"got {describe(negatives_mask)}")
        rows_index = (torch.arange(offset, offset + h, device=device) if anchor_index is None
                      else _check_index(where, anchor_index, h, device))
        cols_index = (torch.arange(width, device=device) if candidate_index is None
                      else _check_index(where, candidate_index, width, device))
    if block_size is not None or h * width > PLAIN_MAX_BATCH ** 2:
        block = resolve_block_size(where, block_size, max(h, width))
        dense = negatives_mask if isinstance(negatives_mask, Tensor) else None
        tile_mask = None if isinstance(negatives_mask, Tensor) else negatives_mask
        tiles = _MaskTiles(dense, tile_mask, rows_index, include_positive, offset=offset,
                           cols_index=cols_index)
        lse, _, positive, counts, _ = _tiled_logsumexp(anchors, candidates, scale_t, block,
                                                       tiles, False)
        return AnchorLogSumExp(lse, positive, counts)
    logits = _scaled(anchors, scale_t) @ candidates.T  # (h, W)
    own = torch.arange(h, device=device)
    positive = logits[own, own + offset]
    if isinstance(negatives_mask, Tensor):
        allowed = negatives_mask.clone()
    elif negatives_mask is not None:
        assert rows_index is not None and cols_index is not None
        excluded = _MaskTiles(None, negatives_mask, rows_index, include_positive,
                              offset=offset, cols_index=cols_index).excluded(
            0, h, 0, width, torch.empty(h, width, dtype=torch.bool, device=device))
        assert excluded is not None
        allowed = excluded.logical_not_()
    else:
        allowed = torch.ones(h, width, dtype=torch.bool, device=device)
    allowed[own, own + offset] = include_positive
    counts = allowed.sum(dim=1)
    has = counts > 0
    lse = logits.new_full((h,), -math.inf)
    if bool(has.all()):
        lse = masked_logsumexp(logits, allowed, dim=1)
    elif bool(has.any()):
        lse = lse.index_put((has,), masked_logsumexp(logits[has], allowed[has], dim=1))
    return AnchorLogSumExp(lse, positive, counts)


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DENSE_MASK_MAX_ENTRIES",
    "PLAIN_MAX_BATCH",
    "AnchorLogSumExp",
    "NegativeLogSumExp",
    "TileMask",
    "anchor_logsumexp",
    "densify",
    "tiled_clip_loss",
    "tiled_info_nce",
    "tiled_masked_row_logsumexp",
]
