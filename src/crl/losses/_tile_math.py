"""Numerics of one tile of the tiled kernel (:mod:`crl.losses._tiled_kernel`): log-sum-exps of
a tile's rows and columns with one ``exp`` per entry, and the ranges that make that exact."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

#: Per row (column) block: the min and max of the row (column) log-sum-exps,
#: as ``(row_min, row_max, col_min, col_max)`` lists.
Bounds = tuple[list[float], list[float], list[float], list[float]]


def spans(total: int, block: int) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` of consecutive blocks of ``block`` covering ``range(total)``."""
    for start in range(0, total, block):
        yield start, min(start + block, total)


def tile_spans(rows: int, cols: int, block: int) -> Iterator[tuple[int, int, int, int]]:
    """``(r0, r1, c0, c1)`` of every ``block x block`` tile of a ``rows x cols`` matrix, by rows."""
    for r0, r1 in spans(rows, block):
        for c0, c1 in spans(cols, block):
            yield r0, r1, c0, c1


def exp_floor(dtype: torch.dtype) -> float:
    """The smallest ``x`` whose ``exp(x)`` is a normal number of ``dtype``.

    Arguments of ``exp`` are clamped to it: an ``exp`` that underflows to a subnormal or to 0 is
    several times slower on CPUs, and a term below ``exp(floor)`` (``1e-38`` in float32) next to
    the largest term ``exp(0) = 1`` of a max-shifted sum changes nothing at the dtype's precision.
    """
    return math.log(torch.finfo(dtype).tiny) + 0.5


def logit_bound(a_s: Tensor, b: Tensor, dtype: torch.dtype) -> float:
    """``max_i |a_s_i| max_j |b_j|`` (norms in ``dtype``), a bound on every ``|L_ij|`` (0 for
    an empty side)."""
    if a_s.numel() == 0 or b.numel() == 0:
        return 0.0
    return (float(torch.linalg.vector_norm(a_s, dim=1, dtype=dtype).max())
            * float(torch.linalg.vector_norm(b, dim=1, dtype=dtype).max()))


def needs_floor(bound: float, rows: int, cols: int, dtype: torch.dtype) -> bool:
    """Whether an ``exp`` argument of the kernel can fall below :func:`exp_floor`.

    Every argument is a logit minus a row's (or column's) maximum or log-sum-exp, so it is at
    least ``-2 bound - log max(h, W)`` (:func:`logit_bound`); when that is above the floor the
    clamps are no-ops and are skipped (two passes over every tile fewer). Masked entries are
    ``-inf`` and ``exp(-inf) = 0`` exactly, with no clamp.
    """
    return 2.0 * bound + math.log(max(rows, cols, 1)) + 1.0 >= -exp_floor(dtype)


def precision_margin(dtype: torch.dtype, terms: int) -> float:
    """``log(4 n / eps)``: terms below ``exp(-margin)`` times the total, ``n`` of them, change a
    sum by less than a quarter of the dtype's ``eps`` relative."""
    return math.log(4.0 * max(terms, 1) / torch.finfo(dtype).eps)


def tile_logsumexps(x: Tensor, work: Tensor, want_cols: bool, clamp: bool = True
                    ) -> tuple[Tensor, Tensor | None]:
    """Row and (optionally) column log-sum-exps of a tile ``x (h, w)`` with one ``exp`` per entry.

    ``E = exp(x - m_row)`` gives the rows. The columns reuse it: ``sum_i exp(x_ij - K) =
    sum_i E_ij exp(m_i - K)`` (``K`` the tile's max) is the product ``E.T @ exp(m - K)``. Every
    ``exp`` argument is clamped at the floor, so that product is exact except for a column whose
    sum is within ``exp(margin)`` of the floor's scale; those few columns (far below the tile's
    max, e.g. at very low temperature) are recomputed directly. ``-inf`` marks a line of ``x``
    that is all ``-inf``; ``work`` is scratch of ``x``'s shape; ``clamp=False`` when no argument
    can fall below the floor (:func:`needs_floor`).
    """
    floor = exp_floor(x.dtype)
    peak = x.amax(dim=1, keepdim=True)  # (h, 1)
    empty = torch.isneginf(peak)
    safe_peak = peak.masked_fill(empty, 0.0)
    e = torch.sub(x, safe_peak, out=work)
    e = (e.clamp_(min=floor) if clamp else e).exp_()  # (h, w)
    rows = e.sum(dim=1, keepdim=True).log_().add_(safe_peak).masked_fill_(empty, -math.inf)
    if not want_cols:
        return rows.squeeze(1), None
    top = peak.max()
    if bool(torch.isneginf(top)):
        return rows.squeeze(1), x.new_full((x.shape[1],), -math.inf)
    weights = (peak - top).clamp_(min=floor).exp_().masked_fill_(empty, 0.0)  # (h, 1)
    cols = torch.mv(e.T, weights.squeeze(1)).log_().add_(top)  # (w,)
    low = cols < top + floor + precision_margin(x.dtype, 2 * x.shape[0])
    if bool(low.any()):
        where_low = low.nonzero().squeeze(1)
        cols[where_low] = torch.logsumexp(x[:, where_low], dim=0)
    return rows.squeeze(1), cols


def block_bounds(lse_rows: Tensor, lse_cols: Tensor | None, block: int) -> Bounds | None:
    """Per block of ``block`` rows (columns): the min and max of the row (column) log-sum-exps;
    None without columns."""
    if lse_cols is None:
        return None
    cols = lse_cols.reshape(-1)
    pad = (-lse_rows.shape[0]) % block

    def minmax(x: Tensor) -> tuple[list[float], list[float]]:
        lo = torch.cat([x, x.new_full((pad,), math.inf)]).view(-1, block).amin(dim=1)
        hi = torch.cat([x, x.new_full((pad,), -math.inf)]).view(-1, block).amax(dim=1)
        return lo.tolist(), hi.tolist()

    rows_lo, rows_hi = minmax(lse_rows)
    cols_lo, cols_hi = minmax(cols)
    return rows_lo, rows_hi, cols_lo, cols_hi


def span(bounds: Bounds, bi: int, bj: int) -> float:
    """The width of the interval that holds row block ``bi``'s and column block ``bj``'s
    log-sum-exps."""
    rows_lo, rows_hi, cols_lo, cols_hi = bounds
    return max(rows_hi[bi], cols_hi[bj]) - min(rows_lo[bi], cols_lo[bj])
