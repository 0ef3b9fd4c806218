"""Numerics of one tile of the tiled kernel (:mod:`crl.losses._tiled_kernel`): a tile's product,
the log-sum-exps of its rows and columns with one ``exp`` per entry (forward), its gradient
operand ``G`` (backward, :class:`TileGradient`), and the ranges that make them exact."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from crl.losses._tile_negatives import TileNegatives

#: Per row (column) block: the min and max of the row (column) log-sum-exps,
#: as ``(row_min, row_max, col_min, col_max)`` lists.
Bounds = tuple[list[float], list[float], list[float], list[float]]

#: ``1 / ln 2``: ``exp(x) = exp2(x / ln 2)``. A wide dtype's ``exp`` is taken as ``exp2`` of the
#: argument times this (:func:`exp_into`): about half the time of ``exp`` on AVX-512 CPUs, at the
#: cost of one more rounding of the argument (relative ``|x| u``, as large as the rounding the
#: argument already carries).
LOG2E = 1.0 / math.log(2.0)

#: The largest logit bound at which the kernel takes ``exp(L)`` with no shift (the forward's
#: sums, the wide-dtype backward's direct tiles): ``exp(64)`` times 2^31 terms stays below
#: float32's largest number, ``exp(-64)`` above its smallest normal one.
DIRECT_MAX_LOGIT = 64.0

#: The largest rounding of a forward logit (``bound * u``) at which a narrow-dtype backward
#: takes the row shift inside the product (logits of unit vectors at ``tau >= 0.04``).
SHIFT_INSIDE_MAX_ERROR = 0.1


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


def exp_into(x: Tensor, shift: Tensor | None, out: Tensor, floor: float | None) -> Tensor:
    """``exp(x - shift)`` in ``out`` (which may be ``x``), its argument clamped at ``floor``
    unless that is None; ``shift`` broadcasts against ``x`` (None: no shift).

    For float32 and float64 the shift and the change of base go into one pass, ``t = x / ln 2
    - shift / ln 2``, and ``exp2(t)`` another (:data:`LOG2E`); narrow dtypes take ``exp`` of
    ``x - shift`` as it stands (a second rounding of the argument in bfloat16 would cost up to
    ``|x| 2^-8`` relative)."""
    if x.dtype in (torch.float32, torch.float64):
        if shift is None:
            t = torch.mul(x, LOG2E, out=out)
        else:
            t = torch.add(shift.mul(-LOG2E), x, alpha=LOG2E, out=out)
        return (t.clamp_(min=floor * LOG2E) if floor is not None else t).exp2_()
    if shift is not None:
        t = torch.sub(x, shift, out=out)
    else:
        t = x if out is x else out.copy_(x)
    return (t.clamp_(min=floor) if floor is not None else t).exp_()


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


def tile_product(a_s: Tensor, b: Tensor, r0: int, r1: int, c0: int, c1: int,
                 logits_buf: Tensor, scratch: Tensor) -> Tensor:
    """Tile ``L[r0:r1, c0:c1] = a_s[r0:r1] @ b[c0:c1].T`` ``(h, w)`` in ``logits_buf`` (the
    accumulation dtype). The product runs in the inputs' dtype; when that is narrower it is
    written into ``scratch`` (a buffer of the accumulation dtype, used by the caller only after)
    and widened."""
    h, w = r1 - r0, c1 - c0
    if a_s.dtype == logits_buf.dtype:
        return torch.mm(a_s[r0:r1], b[c0:c1].T, out=logits_buf[: h * w].view(h, w))
    narrow = torch.mm(a_s[r0:r1], b[c0:c1].T, out=scratch.view(a_s.dtype)[: h * w].view(h, w))
    return logits_buf[: h * w].view(h, w).copy_(narrow)


def shift_inside(a_s: Tensor, b: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
    """``([a_s, -hi, -lo, 0], [b, 1, 1, 0])`` in ``a_s``'s dtype, ``hi + lo = shift (h, 1)`` to
    about twice that dtype's precision, zero-padded to a width of a multiple of 8: their product
    is ``L - shift_i``, accumulated in float32 by the matmul and rounded once."""
    hi = shift.to(a_s.dtype)
    lo = (shift - hi.to(shift.dtype)).to(a_s.dtype)
    pad = (-(a_s.shape[1] + 2)) % 8
    left = torch.cat([a_s, -hi, -lo, a_s.new_zeros(a_s.shape[0], pad)], dim=1)
    right = torch.cat([b, b.new_ones(b.shape[0], 2), b.new_zeros(b.shape[0], pad)], dim=1)
    return left, right


def small_rounding(bound: float, dtype: torch.dtype) -> bool:
    """Whether ``dtype``'s rounding of a logit, at most ``bound * u`` (``u`` the unit roundoff),
    is at most :data:`SHIFT_INSIDE_MAX_ERROR`."""
    return bound * torch.finfo(dtype).eps / 2 <= SHIFT_INSIDE_MAX_ERROR


class FactoredTile(NamedTuple):
    """A tile's ``G = P * (w_i + u_i t_j)`` left unformed: ``p (h, w)`` in the inputs' dtype,
    ``w (h,)`` and, when the other direction has a gradient, ``u (h,)`` and ``t (w,)``
    (:meth:`TileGradient._factors`). The gradient products take the factors into their
    operands (:func:`crl.losses._tiled_kernel._add_factored`), so ``G`` is never written."""

    p: Tensor
    w: Tensor
    u: Tensor | None
    t: Tensor | None


class TilePlan(NamedTuple):
    """What the forward hands the backward besides the saved tensors: the tile side, the
    candidates, whether an ``exp`` argument can fall below the floor (:func:`needs_floor`) and
    the bound on every ``|L_ij|`` (:func:`logit_bound`)."""

    block: int
    tiles: TileNegatives
    clamp: bool
    bound: float


class TileGradient:
    """``G`` of one tile at a time, the operand of the backward's gradient products.

    ``G_ij = g_row_i P_row_ij + g_col_j P_col_ij`` with the softmaxes ``P_row = exp(L_ij -
    lse_row_i)`` and ``P_col = exp(L_ij - lse_col_j)`` (0 where ``L_ij`` is not a candidate;
    docs/theory.md §12). Per tile, one of four routines:

    - :meth:`_direct` (float32 / float64 inputs with every ``|L_ij|`` at most
      :data:`DIRECT_MAX_LOGIT` and no clamp, ``direct=True``): ``G = exp(L_ij) * (c_i + t_j)``
      with ``c = g_row exp(-lse_row)`` and ``t = g_col exp(-lse_col)``, the same sum as
      ``g_row P_row + g_col P_col`` with ``exp(L_ij)`` taken out; the ``1 / ln 2`` of
      ``exp2`` rides in the product (the forward's own rounding of ``L``,
      :func:`direct_operand`): three passes over the tile (``exp2``, the broadcast sum, the
      product) instead of five or six;
    - :meth:`_shifted_softmax` (narrow inputs with a small rounding of the logits): ``P_row``
      straight from the product ``[a_s, -lse_row] @ [b, 1].T``, in the inputs' dtype, returned
      with its factors (:class:`FactoredTile`): no pass over the tile besides its ``exp``;
    - :func:`_one_exp`: ``G = P_row * (g_row_i + u_i t_j)`` where the tile's log-sum-exps span
      at most the window (:meth:`_factors`), or ``G = g_row_i P_row`` with rows only;
    - :meth:`_two_exps`: ``P_row`` and ``P_col`` each from its own ``exp`` of the recomputed
      logits (:meth:`_logits`), the other tiles.

    ``factored=False`` leaves out the second routine (``G`` formed from one ``exp``, then plain
    gradient products: fewer matrix-unit flops, more passes over the tile; which is faster
    depends on the machine, :func:`crl.losses._tiled_kernel.factored_backward`).
    Every ``exp`` argument is clamped at the floor when the forward found one can be below it
    (``plan.clamp``). ``G`` comes back in the inputs' dtype: formed there by the first routine,
    else in the accumulation dtype and rounded once.
    """

    def __init__(self, a_s: Tensor, b: Tensor, lse: tuple[Tensor, Tensor], plan: TilePlan,
                 grads: tuple[Tensor | None, Tensor | None], factored: bool = True,
                 direct: bool = True) -> None:
        lse_rows, lse_cols = lse
        self.a_s, self.b, self.plan = a_s, b, plan
        self.grad_rows, self.grad_cols = grads
        acc, block = lse_rows.dtype, plan.block
        self.weights = (direct_weights(lse_rows, lse_cols, grads)
                        if direct and direct_tiles(a_s.dtype, acc, plan) else None)
        self.a_2 = direct_operand(a_s) if self.weights is not None else None
        # A row with no candidate has lse = -inf and only -inf logits: shift it by 0 instead.
        self.shift_rows = torch.nan_to_num(lse_rows, neginf=0.0).unsqueeze(1)  # (h, 1)
        self.shift_cols = (torch.nan_to_num(lse_cols, neginf=0.0).unsqueeze(0)
                           if self.grad_cols is not None else None)  # (1, W)
        self.floor = exp_floor(acc)
        # Both directions from one exp: P_col = P_row * exp(lse_row_i - lse_col_j). When a
        # tile's log-sum-exps span at most `window`, exp(lse_row_i - low) and
        # exp(low - lse_col_j) neither overflow nor underflow, and a P_row clamped at the
        # floor stands for a P_col below eps / (4 B): negligible. Other tiles take two exps.
        self.window = -self.floor - precision_margin(acc, 4 * max(a_s.shape[0], b.shape[0]))
        self.bounds = block_bounds(self.shift_rows.squeeze(1), self.shift_cols, block)
        self.grad_buf = lse_rows.new_empty(block * block)
        self.logits_buf = lse_rows.new_empty(block * block)
        # Narrow inputs: G rounded for the gradient products, and a factor, in the logits'
        # buffer (free by then). Where the forward's rounding of a logit (at most bound * u,
        # u the unit roundoff) is small, the row shift rides inside the product, P_row = its
        # exp: three passes over the tile instead of six; elsewhere (very low temperatures)
        # the backward recomputes the forward's rounded logits, so P_row sums to 1 exactly.
        narrow = a_s.dtype != acc
        self.low_buf = self.logits_buf.view(a_s.dtype) if narrow else None
        self.shifted = (shift_inside(a_s, b, self.shift_rows)
                        if factored and narrow and small_rounding(plan.bound, a_s.dtype)
                        else None)
        self.excluded_buf = (None if plan.tiles.trivial else
                             torch.empty(block * block, dtype=torch.bool, device=a_s.device))

    def with_own_buffers(self) -> TileGradient:
        """A copy that shares everything but the scratch buffers, for a stream of tiles that
        runs beside this one (:func:`crl.losses._tiled_kernel.run_streams`)."""
        twin = copy.copy(self)
        twin.grad_buf = torch.empty_like(self.grad_buf)
        twin.logits_buf = torch.empty_like(self.logits_buf)
        if self.low_buf is not None:
            twin.low_buf = twin.logits_buf.view(self.low_buf.dtype)
        if self.excluded_buf is not None:
            twin.excluded_buf = torch.empty_like(self.excluded_buf)
        return twin

    def __call__(self, r0: int, r1: int, c0: int, c1: int) -> Tensor | FactoredTile:
        """``G (h, w)`` of tile ``[r0, r1) x [c0, c1)``, in the inputs' dtype, or its factors
        (:class:`FactoredTile`: narrow inputs whose row shift rides inside the product, where
        folding the factors into the gradient products' operands is cheaper than two more
        passes over the tile)."""
        h, w = r1 - r0, c1 - c0
        excluded = (None if self.excluded_buf is None else self.plan.tiles.excluded(
            r0, r1, c0, c1, self.excluded_buf[: h * w].view(h, w)))
        if self.weights is not None:
            return self._direct(r0, r1, c0, c1, excluded)
        factors = self._factors(r0, r1, c0, c1)
        rows = None if self.grad_rows is None else self.grad_rows[r0:r1]
        if self.shifted is not None and self.low_buf is not None and rows is not None \
                and (factors is not None or self.grad_cols is None):
            p_row = self._shifted_softmax(r0, r1, c0, c1, excluded)
            u, t = factors if factors is not None else (None, None)
            return FactoredTile(p_row, rows, u, t)
        logits = self._logits(r0, r1, c0, c1, excluded)
        g = self.grad_buf[: h * w].view(h, w)
        if factors is not None and rows is not None:
            g = _one_exp(self._exp_shifted(logits, self.shift_rows[r0:r1], g), rows,
                         factors, logits)
        else:
            g = self._two_exps(logits, g, r0, r1, c0, c1)
        return g if self.low_buf is None else self.low_buf[: h * w].view(h, w).copy_(g)

    def _direct(self, r0: int, r1: int, c0: int, c1: int, excluded: Tensor | None) -> Tensor:
        """``G (h, w) = exp(L_ij) * (c_i + t_j)`` (either term alone when one direction has no
        gradient), from ``L / ln 2 = (a_s / ln 2) @ b.T`` and ``exp2``; ``-inf`` (so 0) where
        not a candidate."""
        assert self.weights is not None and self.a_2 is not None
        h, w = r1 - r0, c1 - c0
        c, t = self.weights
        g = torch.mm(self.a_2[r0:r1], self.b[c0:c1].T, out=self.grad_buf[: h * w].view(h, w))
        if excluded is not None:
            g.masked_fill_(excluded, -math.inf)
        g.exp2_()
        if c is not None and t is not None:
            both = torch.add(c[r0:r1].unsqueeze(1), t[c0:c1].unsqueeze(0),
                             out=self.logits_buf[: h * w].view(h, w))
            return g.mul_(both)
        if c is not None:
            return g.mul_(c[r0:r1].unsqueeze(1))
        assert t is not None
        return g.mul_(t[c0:c1].unsqueeze(0))

    def _exp(self, x: Tensor) -> Tensor:
        """``exp`` in place, of arguments clamped at the floor where one can be below it."""
        return exp_into(x, None, x, self.floor if self.plan.clamp else None)

    def _exp_shifted(self, x: Tensor, shift: Tensor, out: Tensor) -> Tensor:
        """``exp(x - shift)`` in ``out`` (:func:`exp_into`), clamped as :meth:`_exp`."""
        return exp_into(x, shift, out, self.floor if self.plan.clamp else None)

    def _factors(self, r0: int, r1: int, c0: int, c1: int) -> tuple[Tensor, Tensor] | None:
        """``u (h,) = exp(lse_row_i - low)`` and ``t (w,) = exp(low - lse_col_j) g_col_j``
        (``low`` the smallest log-sum-exp of the tile's row and column blocks), so that
        ``u_i t_j = g_col_j exp(lse_row_i - lse_col_j)`` and ``g_col_j P_col = P_row u_i t_j``;
        None unless both directions have a gradient and the blocks' log-sum-exps span at most
        the window (then both factors are in range)."""
        bi, bj = r0 // self.plan.block, c0 // self.plan.block
        if self.bounds is None or self.grad_rows is None \
                or span(self.bounds, bi, bj) > self.window:
            return None
        assert self.shift_cols is not None and self.grad_cols is not None
        low = min(self.bounds[0][bi], self.bounds[2][bj])
        u = (self.shift_rows[r0:r1, 0] - low).exp_()  # in [1, e^window]
        t = (low - self.shift_cols[0, c0:c1]).exp_().mul_(self.grad_cols[c0:c1])
        return u, t

    def _shifted_softmax(self, r0: int, r1: int, c0: int, c1: int, excluded: Tensor | None
                         ) -> Tensor:
        """``P_row (h, w) = exp([a_s, -lse_row] @ [b, 1].T) = exp(L_ij - lse_row_i)`` in the
        inputs' dtype (the shift accumulated in float32 inside the matmul, rounded once;
        :func:`shift_inside`)."""
        assert self.shifted is not None and self.low_buf is not None
        h, w = r1 - r0, c1 - c0
        left, right = self.shifted
        p_row = torch.mm(left[r0:r1], right[c0:c1].T, out=self.low_buf[: h * w].view(h, w))
        if excluded is not None:
            p_row.masked_fill_(excluded, -math.inf)
        return self._exp(p_row)

    def _logits(self, r0: int, r1: int, c0: int, c1: int, excluded: Tensor | None) -> Tensor:
        """``L[r0:r1, c0:c1] (h, w)`` in the accumulation dtype, exactly as the forward rounded
        it, ``-inf`` where not a candidate."""
        logits = tile_product(self.a_s, self.b, r0, r1, c0, c1, self.logits_buf, self.grad_buf)
        if excluded is not None:
            logits.masked_fill_(excluded, -math.inf)
        return logits

    def _two_exps(self, logits: Tensor, g: Tensor, r0: int, r1: int, c0: int, c1: int
                  ) -> Tensor:
        """``G = g_row_i exp(L_ij - lse_row_i) + g_col_j exp(L_ij - lse_col_j)`` in ``g``
        (either term alone when one direction has no gradient); overwrites ``logits``."""
        if self.grad_rows is not None:
            g = _one_exp(self._exp_shifted(logits, self.shift_rows[r0:r1], g),
                         self.grad_rows[r0:r1], None)
            if self.shift_cols is not None and self.grad_cols is not None:
                p_col = self._exp_shifted(logits, self.shift_cols[:, c0:c1], logits)
                g.addcmul_(p_col, self.grad_cols[c0:c1].unsqueeze(0))
            return g
        assert self.shift_cols is not None and self.grad_cols is not None
        p_col = self._exp_shifted(logits, self.shift_cols[:, c0:c1], g)
        return p_col.mul_(self.grad_cols[c0:c1].unsqueeze(0))


def direct_operand(a_s: Tensor) -> Tensor:
    """``a_s / ln 2`` (:data:`LOG2E`): its product with ``b.T`` is ``L / ln 2``, the argument of
    ``exp2`` for ``exp(L)``. The forward and the backward's direct tiles take ``L`` from this
    same product, so the backward's softmaxes are those of the forward's log-sum-exps."""
    return a_s * LOG2E


def direct_tiles(dtype: torch.dtype, acc: torch.dtype, plan: TilePlan) -> bool:
    """Whether tiles of inputs of ``dtype`` can take ``exp(L)`` with no shift: wide inputs
    (``dtype`` the accumulation dtype ``acc``), every ``|L_ij|`` at most
    :data:`DIRECT_MAX_LOGIT` and no ``exp`` argument below the floor (:func:`needs_floor`)."""
    return dtype == acc and plan.bound <= DIRECT_MAX_LOGIT and not plan.clamp


def direct_weights(lse_rows: Tensor, lse_cols: Tensor, grads: tuple[Tensor | None, Tensor | None]
                   ) -> tuple[Tensor | None, Tensor | None] | None:
    """``c = g_row exp(-lse_row)`` ``(h,)`` and ``t = g_col exp(-lse_col)`` ``(W,)`` (None for
    a direction with no gradient; 0 for a line with no candidate, whose ``exp(L)`` are all 0),
    so that ``g_row_i P_row_ij + g_col_j P_col_ij = exp(L_ij) (c_i + t_j)``; None (take the
    shifted routines) unless every weight is finite, every nonzero ``g`` gives a normal weight
    (full relative precision) and ``c_i + t_j`` cannot overflow."""
    finfo = torch.finfo(lse_rows.dtype)
    out: list[Tensor | None] = []
    for lse, grad in zip((lse_rows, lse_cols), grads, strict=True):
        if grad is None:
            out.append(None)
            continue
        weight = torch.where(torch.isneginf(lse), 0.0, grad * torch.exp(-lse))
        size = weight.abs()
        normal = (size >= finfo.tiny) | (grad == 0) | torch.isneginf(lse)
        if not bool((torch.isfinite(weight) & normal & (size <= finfo.max / 4)).all()):
            return None
        out.append(weight)
    if out[0] is None and out[1] is None:
        return None
    return out[0], out[1]


def _one_exp(p_row: Tensor, grad_rows: Tensor, factors: tuple[Tensor, Tensor] | None,
             out: Tensor | None = None) -> Tensor:
    """``G = P_row * (g_row_i + u_i t_j)`` in ``p_row`` and its dtype (``g_col_j P_col =
    P_row u_i t_j``, :meth:`TileGradient._factors`; ``out``: scratch of ``p_row``'s shape and
    dtype), or ``G = g_row_i P_row`` without ``factors``."""
    dtype = p_row.dtype
    if factors is None:
        return p_row.mul_(grad_rows.unsqueeze(1).to(dtype))
    u, t = factors
    # w_i + u_i t_j as a product and a broadcast add: two light passes (torch.addr took ~3x).
    weights = torch.mul(u.to(dtype).unsqueeze(1), t.to(dtype).unsqueeze(0), out=out)
    return p_row.mul_(weights.add_(grad_rows.unsqueeze(1).to(dtype)))
