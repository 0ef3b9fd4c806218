"""The exact tiled log-sum-exp kernel behind every large contrastive loss (private).

For anchors ``a (h, D)``, candidates ``b (W, D)`` and ``L = diag(scale) a @ b.T`` (``h x W``,
never stored), it returns per anchor ``lse_i = log sum_{j in C(i)} exp(L_ij)`` over the anchor's
candidates ``C(i)`` (its negatives, plus its positive ``j = offset + i`` when included), the
positive logit ``L_{i, offset + i}`` and ``|C(i)|``; for a square batch also the column
log-sum-exps (each candidate as the anchor of the other direction) from the same tiles.

The identity that makes tiles exact (the idea of Inf-CL, Cheng et al. 2024, written in plain
torch): a log-sum-exp over a union of disjoint column blocks is the ``logaddexp`` of the blocks'
log-sum-exps, and its gradient is the softmax ``dlse_i / dL_ij = P_ij = exp(L_ij - lse_i)``, which
needs only the final ``lse_i`` and the entry itself. So

- **forward**: for each ``T x T`` tile ``L[R, C]``, merge its row (and column) log-sum-exps into
  running ones with ``logaddexp``; the tiles holding positives give ``L_{i, offset + i}``;
- **backward**: recompute each tile, ``G = g_row * P_row + g_col * P_col`` (``g_*`` the incoming
  gradients), then ``grad_a[R] += scale * G @ b[C]``, ``grad_b[C] += G.T @ (scale * a[R])`` and
  ``grad_scale += sum_ij G_ij s_ij = sum_i a_i . (G @ b)_i``: sums over tiles, exact up to rounding.

That is ``8 h W D`` flops for forward + backward and three ``(T, T)`` buffers. One ``exp`` per
entry and pass serves both directions: the column sums are ``exp(L - m_row).T @ exp(m_row - K)``
and ``P_col = P_row * exp(lse_row_i - lse_col_j)`` wherever that is exact in the dtype (other
tiles take a second ``exp``; :mod:`crl.losses._tile_math`).

Precision: tile products run in the inputs' dtype. For bfloat16 / float16 inputs the forward's
product tile is widened to float32 before its maxima and ``exp`` (no maxima where every logit is
small enough for ``exp`` to be in range); log-sum-exps, counts and the gradient accumulators are
float32; gradients are returned in the input dtype. ``G`` is an operand
of the two bf16 gradient products: where the forward's rounding of a logit is small (moderate
scales, :data:`SHIFT_INSIDE_MAX_ERROR`) it is formed in the input dtype from the product
``[a_s, -lse] @ [b, 1].T = L - lse_row`` (the shift accumulated in float32 inside the matmul,
rounded once), else in float32 from the forward's own rounded logits and rounded at the end.
Autocast is switched off inside, so the inputs' dtype decides.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from crl.losses._common import masked_logsumexp
from crl.losses._tile_math import (
    Bounds,
    block_bounds,
    exp_floor,
    logit_bound,
    needs_floor,
    precision_margin,
    span,
    tile_logsumexps,
    tile_spans,
)
from crl.losses._tile_negatives import TileNegatives

#: The largest rounding of a forward logit (``bound * u``) at which a narrow-dtype backward
#: takes the row shift inside the product (logits of unit vectors at ``tau >= 0.04``).
SHIFT_INSIDE_MAX_ERROR = 0.1


class KernelOut(NamedTuple):
    """``lse_rows (h,)``, ``lse_cols (W,)`` (empty without columns), ``positive (h,)`` and the
    int64 candidate counts of rows ``(h,)`` and columns ``(W,)``."""

    lse_rows: Tensor
    lse_cols: Tensor
    positive: Tensor
    count_rows: Tensor
    count_cols: Tensor


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for bfloat16 / float16 products, else the products' own dtype."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def scaled(a: Tensor, scale: Tensor) -> Tensor:
    """``scale * a`` in ``a``'s dtype, computed in ``scale``'s, for a 0-dim or ``(h,)`` scale
    (one rounding for bfloat16 ``a``)."""
    if scale.dim() == 0:
        return a * scale  # a 0-dim tensor keeps a's dtype; the product is taken in scale's
    return (a.to(scale.dtype) * scale.unsqueeze(1)).to(a.dtype)


def _product(a_s: Tensor, b: Tensor, r0: int, r1: int, c0: int, c1: int, logits_buf: Tensor,
             scratch: Tensor) -> Tensor:
    """Tile ``L[r0:r1, c0:c1] = a_s[r0:r1] @ b[c0:c1].T`` ``(h, w)`` in ``logits_buf`` (the
    accumulation dtype). The product runs in the inputs' dtype; when that is narrower it is
    written into ``scratch`` (a buffer of the accumulation dtype, used by the caller only after)
    and widened."""
    h, w = r1 - r0, c1 - c0
    if a_s.dtype == logits_buf.dtype:
        return torch.mm(a_s[r0:r1], b[c0:c1].T, out=logits_buf[: h * w].view(h, w))
    narrow = torch.mm(a_s[r0:r1], b[c0:c1].T, out=scratch.view(a_s.dtype)[: h * w].view(h, w))
    return logits_buf[: h * w].view(h, w).copy_(narrow)


def _shift_inside(a_s: Tensor, b: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
    """``([a_s, -hi, -lo, 0], [b, 1, 1, 0])`` in ``a_s``'s dtype, ``hi + lo = shift (h, 1)`` to
    about twice that dtype's precision, zero-padded to a width of a multiple of 8: their product
    is ``L - shift_i``, accumulated in float32 by the matmul and rounded once."""
    hi = shift.to(a_s.dtype)
    lo = (shift - hi.to(shift.dtype)).to(a_s.dtype)
    pad = (-(a_s.shape[1] + 2)) % 8
    left = torch.cat([a_s, -hi, -lo, a_s.new_zeros(a_s.shape[0], pad)], dim=1)
    right = torch.cat([b, b.new_ones(b.shape[0], 2), b.new_zeros(b.shape[0], pad)], dim=1)
    return left, right


def _direction_factors(bounds: Bounds, bi: int, bj: int, shift_rows: Tensor,
                       shift_cols: Tensor, grad_cols: Tensor) -> tuple[Tensor, Tensor]:
    """``u (h,) = exp(lse_row_i - low)`` and ``t (w,) = exp(low - lse_col_j) g_col_j`` with
    ``low`` the smallest log-sum-exp of the tile's blocks: ``u_i t_j = exp(lse_row_i -
    lse_col_j) g_col_j``, both in range when the blocks span at most the window."""
    low = min(bounds[0][bi], bounds[2][bj])
    u = (shift_rows - low).exp_()  # in [1, e^window]
    t = (low - shift_cols).exp_().mul_(grad_cols)
    return u, t


def _add_product(acc: Tensor, g: Tensor | None, low: Tensor | None, y: Tensor) -> None:
    """``acc += g @ y``, from ``low`` (``G`` in ``y``'s narrower dtype) when given."""
    if low is None:
        assert g is not None
        acc.addmm_(g, y)
    else:
        acc.add_(torch.mm(low, y))


class _TiledLogSumExp(torch.autograd.Function):
    """The autograd function of :func:`tiled_logsumexp` (derivation in the module docstring)."""

    @staticmethod
    def forward(ctx: FunctionCtx, a: Tensor, b: Tensor, scale: Tensor, block: int,
                tiles: TileNegatives, want_cols: bool) -> tuple[Tensor, ...]:
        with torch.autocast(a.device.type, enabled=False):
            n_rows, n_cols = a.shape[0], b.shape[0]
            acc = scale.dtype
            a_s = scaled(a, scale)  # (h, D)
            lse_rows = torch.full((n_rows,), -math.inf, dtype=acc, device=a.device)
            lse_cols = (torch.full((n_cols,), -math.inf, dtype=acc, device=a.device)
                        if want_cols else lse_rows.new_empty(0))
            diagonal = lse_rows.new_empty(n_rows)
            count_rows = torch.zeros(n_rows, dtype=torch.int64, device=a.device)
            count_cols = torch.zeros(n_cols, dtype=torch.int64, device=a.device)
            work_buf = lse_rows.new_empty(block * block)
            bound = logit_bound(a_s, b, acc)
            clamp = needs_floor(bound, n_rows, n_cols, acc)
            logits_buf = lse_rows.new_empty(block * block)
            excluded_buf = (None if tiles.trivial else
                            torch.empty(block * block, dtype=torch.bool, device=a.device))
            # Narrow inputs with every |L_ij| <= 1 / (10 u) (u the unit roundoff; 25.6 for bf16):
            # exp(L) is in range, so the widened tile's exps are summed with no maxima.
            direct = a.dtype != acc and bound * torch.finfo(a.dtype).eps / 2 <= \
                SHIFT_INSIDE_MAX_ERROR
            ones = lse_rows.new_ones(block)
            for r0, r1, c0, c1 in tile_spans(n_rows, n_cols, block):
                h, w = r1 - r0, c1 - c0
                logits = _product(a_s, b, r0, r1, c0, c1, logits_buf, work_buf)
                excluded = (None if excluded_buf is None else
                            tiles.excluded(r0, r1, c0, c1, excluded_buf[: h * w].view(h, w)))
                lo, hi, k = tiles.positives(r0, r1, c0, c1)
                if hi > lo:
                    diagonal[lo:hi] = logits.diagonal(k)
                if excluded is None:
                    count_rows[r0:r1] += w
                    count_cols[c0:c1] += h
                else:
                    logits.masked_fill_(excluded, -math.inf)
                    count_rows[r0:r1] += w - excluded.sum(dim=1)
                    count_cols[c0:c1] += h - excluded.sum(dim=0)
                if direct:
                    e = logits.exp_()  # (h, w), every entry in range
                    tile_rows = e.sum(dim=1).log_()
                    tile_cols = torch.mv(e.T, ones[:h]).log_() if want_cols else None
                else:
                    tile_rows, tile_cols = tile_logsumexps(
                        logits, work_buf[: h * w].view(h, w), want_cols, clamp)
                part = lse_rows[r0:r1]
                torch.logaddexp(part, tile_rows, out=part)
                if tile_cols is not None:
                    part = lse_cols[c0:c1]
                    torch.logaddexp(part, tile_cols, out=part)
        ctx.save_for_backward(a, b, scale, lse_rows, lse_cols)
        ctx.block = block  # type: ignore[attr-defined]
        ctx.clamp = clamp  # type: ignore[attr-defined]
        ctx.bound = bound  # type: ignore[attr-defined]
        ctx.tiles = tiles  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(count_rows, count_cols)
        ctx.set_materialize_grads(False)
        return lse_rows, lse_cols, diagonal, count_rows, count_cols

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_rows: Tensor | None, grad_cols: Tensor | None,
                 grad_diagonal: Tensor | None, *_: Any) -> tuple[Tensor | None, ...]:
        a, b, scale, lse_rows, lse_cols = ctx.saved_tensors
        with torch.autocast(a.device.type, enabled=False):
            grads = _backward(a, b, scale, lse_rows, lse_cols, ctx.block, ctx.tiles,
                              (ctx.clamp, ctx.bound),
                              ctx.needs_input_grad[:3], grad_rows, grad_cols, grad_diagonal)
        return (*grads, None, None, None)


def _backward(a: Tensor, b: Tensor, scale: Tensor, lse_rows: Tensor, lse_cols: Tensor,
              block: int, tiles: TileNegatives, ranges: tuple[bool, float],
              needs: tuple[bool, ...],
              grad_rows: Tensor | None, grad_cols: Tensor | None,
              grad_diagonal: Tensor | None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The gradients of ``a``, ``b`` and ``scale`` (module docstring, **backward**);
    ``ranges``: whether the exps need clamping, and the bound on ``|L_ij|``."""
    need_a, need_b, need_scale = needs
    clamp, bound = ranges
    want_a = need_a or need_scale  # grad_scale is read off the grad_a accumulator
    n_rows, n_cols = a.shape[0], b.shape[0]
    acc = scale.dtype
    a_s = scaled(a, scale)  # (h, D)
    acc_a = torch.zeros(a.shape, dtype=acc, device=a.device)  # sum_j G_ij b_j
    acc_b = torch.zeros(b.shape, dtype=acc, device=a.device)  # sum_i G_ij scale_i a_i
    if grad_cols is not None and lse_cols.numel() == 0:
        grad_cols = None
    if grad_rows is not None or grad_cols is not None:
        # A row with no candidate has lse = -inf and only -inf logits: shift it by 0 instead.
        shift_rows = torch.nan_to_num(lse_rows, neginf=0.0).unsqueeze(1)  # (h, 1)
        shift_cols = (torch.nan_to_num(lse_cols, neginf=0.0).unsqueeze(0)
                      if grad_cols is not None else None)  # (1, W)
        floor = exp_floor(acc)

        def exp_(x: Tensor) -> Tensor:
            """``exp`` in place, of arguments clamped at the floor where one can be below it."""
            return (x.clamp_(min=floor) if clamp else x).exp_()

        # Both directions from one exp: P_col = P_row * exp(lse_row_i - lse_col_j). When a
        # tile's log-sum-exps span at most `window`, exp(lse_row_i - low) and
        # exp(low - lse_col_j) neither overflow nor underflow, and a P_row clamped at the
        # floor stands for a P_col below eps / (4 B): negligible. Other tiles take two exps.
        window = -floor - precision_margin(acc, 4 * max(n_rows, n_cols))
        bounds = block_bounds(shift_rows.squeeze(1), shift_cols, block)
        grad_buf = acc_a.new_empty(block * block)
        logits_buf = acc_a.new_empty(block * block)
        narrow = a.dtype != acc
        # Narrow inputs: G rounded for the gradient products, and a factor, in the logits'
        # buffer (free by then). Where the forward's rounding of a logit (at most bound * u,
        # u the unit roundoff) is small, the row shift rides inside the product, P_row = its
        # exp: three passes over the tile instead of six; elsewhere (very low temperatures)
        # the backward recomputes the forward's rounded logits, so P_row sums to 1 exactly.
        low_buf = logits_buf.view(a.dtype) if narrow else None
        inside = narrow and bound * torch.finfo(a.dtype).eps / 2 <= SHIFT_INSIDE_MAX_ERROR
        shifted = _shift_inside(a_s, b, shift_rows) if inside else None
        excluded_buf = (None if tiles.trivial else
                        torch.empty(block * block, dtype=torch.bool, device=a.device))
        for r0, r1, c0, c1 in tile_spans(n_rows, n_cols, block):
            h, w = r1 - r0, c1 - c0
            excluded = (None if excluded_buf is None else
                        tiles.excluded(r0, r1, c0, c1, excluded_buf[: h * w].view(h, w)))
            fast = (grad_rows is not None and shift_cols is not None
                    and grad_cols is not None and bounds is not None
                    and span(bounds, r0 // block, c0 // block) <= window)
            g: Tensor | None = None
            g_low: Tensor | None = None
            if low_buf is not None and shifted is not None and grad_rows is not None \
                    and (fast or grad_cols is None):
                # (h, w) in the inputs' dtype: L - lse_row, then P_row, then G
                g_low = torch.mm(shifted[0][r0:r1], shifted[1][c0:c1].T,
                                 out=low_buf[: h * w].view(h, w))
                if excluded is not None:
                    g_low.masked_fill_(excluded, -math.inf)
                exp_(g_low)
                if fast:
                    assert bounds is not None and shift_cols is not None
                    assert grad_cols is not None
                    u, t = _direction_factors(bounds, r0 // block, c0 // block,
                                              shift_rows[r0:r1, 0], shift_cols[0, c0:c1],
                                              grad_cols[c0:c1])
                    factor = low_buf[block * block: block * block + h * w].view(h, w)
                    g_low.mul_(torch.addr(grad_rows[r0:r1].unsqueeze(1).to(a.dtype),
                                          u.to(a.dtype), t.to(a.dtype), out=factor))
                else:
                    g_low.mul_(grad_rows[r0:r1].unsqueeze(1).to(a.dtype))
            else:
                logits = _product(a_s, b, r0, r1, c0, c1, logits_buf, grad_buf)
                if excluded is not None:
                    logits.masked_fill_(excluded, -math.inf)
                g = grad_buf[: h * w].view(h, w)
                if fast:
                    assert bounds is not None and shift_cols is not None
                    assert grad_rows is not None and grad_cols is not None
                    torch.sub(logits, shift_rows[r0:r1], out=g)
                    exp_(g)  # P_row
                    u, t = _direction_factors(bounds, r0 // block, c0 // block,
                                              shift_rows[r0:r1, 0], shift_cols[0, c0:c1],
                                              grad_cols[c0:c1])
                    # G = P_row * (g_row_i + g_col_j exp(lse_row_i - lse_col_j))
                    g.mul_(torch.addr(grad_rows[r0:r1].unsqueeze(1), u, t, out=logits))
                elif grad_rows is not None:
                    torch.sub(logits, shift_rows[r0:r1], out=g)
                    exp_(g)  # P_row
                    g.mul_(grad_rows[r0:r1].unsqueeze(1))
                    if shift_cols is not None and grad_cols is not None:
                        p_col = exp_(logits.sub_(shift_cols[:, c0:c1]))
                        g.addcmul_(p_col, grad_cols[c0:c1].unsqueeze(0))
                elif shift_cols is not None and grad_cols is not None:
                    torch.sub(logits, shift_cols[:, c0:c1], out=g)
                    exp_(g).mul_(grad_cols[c0:c1].unsqueeze(0))  # P_col
                g_low = None if low_buf is None else low_buf[: h * w].view(h, w).copy_(g)
            if want_a:
                _add_product(acc_a[r0:r1], g, g_low, b[c0:c1])
            if need_b:
                _add_product(acc_b[c0:c1], None if g is None else g.T,
                             None if g_low is None else g_low.T, a_s[r0:r1])
    if grad_diagonal is not None:
        own = slice(tiles.offset, tiles.offset + n_rows)  # the rows' positives
        acc_a.addcmul_(grad_diagonal.unsqueeze(1), b[own].to(acc))
        acc_b[own].addcmul_(grad_diagonal.unsqueeze(1), a_s.to(acc))
    grad_a = scaled(acc_a, scale).to(a.dtype) if need_a else None
    grad_b = acc_b.to(b.dtype) if need_b else None
    grad_scale = None
    if need_scale:
        products = a.to(acc) * acc_a
        grad_scale = products.sum(dim=1) if scale.dim() == 1 else products.sum()
    return grad_a, grad_b, grad_scale


def tiled_logsumexp(a: Tensor, b: Tensor, scale: Tensor, block: int, tiles: TileNegatives,
                    want_cols: bool) -> KernelOut:
    """The kernel on checked inputs: ``a (h, D)`` and ``b (W, D)`` of one dtype, ``scale`` 0-dim
    or ``(h,)`` in the accumulation dtype (:func:`accumulation_dtype`), ``block >= 1``; columns
    need a square batch with offset 0 and a 0-dim scale. Differentiable in ``a``, ``b``, ``scale``.
    """
    out = _TiledLogSumExp.apply(a, b, scale, block, tiles, want_cols)  # type: ignore[no-untyped-call]
    return KernelOut(*cast(tuple[Tensor, Tensor, Tensor, Tensor, Tensor], out))


def plain_logsumexp(anchors: Tensor, candidates: Tensor, scale: Tensor, tiles: TileNegatives
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """The small problems of ``crl.losses.tiled.anchor_logsumexp``, from the whole ``(h, W)``
    logits: ``(lse, positive, counts)``."""
    h, width = anchors.shape[0], candidates.shape[0]
    logits = (scaled(anchors, scale) @ candidates.T).to(scale.dtype)  # (h, W)
    own = torch.arange(h, device=anchors.device)
    positive = logits[own, own + tiles.offset]
    excluded = tiles.excluded(0, h, 0, width, torch.empty(h, width, dtype=torch.bool,
                                                          device=anchors.device))
    allowed = (torch.ones(h, width, dtype=torch.bool, device=anchors.device) if excluded is None
               else excluded.logical_not_())
    counts = allowed.sum(dim=1)
    has = counts > 0
    lse = logits.new_full((h,), -math.inf)
    if bool(has.all()):
        lse = masked_logsumexp(logits, allowed, dim=1)
    elif bool(has.any()):
        lse = lse.index_put((has,), masked_logsumexp(logits[has], allowed[has], dim=1))
    return lse, positive, counts


__all__: list[str] = []
