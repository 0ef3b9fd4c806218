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
- **backward** (:func:`_backward`): recompute each tile, ``G = g_row * P_row + g_col * P_col``
  (``g_*`` the incoming gradients; :class:`~crl.losses._tile_math.TileGradient`), then
  ``grad_a[R] += scale * G @ b[C]``, ``grad_b[C] += G.T @ (scale * a[R])`` and ``grad_scale +=
  sum_ij G_ij s_ij = sum_i a_i . (G @ b)_i``: sums over tiles, exact up to rounding.

That is ``8 h W D`` flops for forward + backward and three ``(T, T)`` buffers. One ``exp`` per
entry and pass serves both directions: the column sums are ``exp(L - m_row).T @ exp(m_row - K)``
and ``P_col = P_row * exp(lse_row_i - lse_col_j)`` wherever that is exact in the dtype (other
tiles take a second ``exp``; :mod:`crl.losses._tile_math`). Where every ``|L_ij|`` is at most
:data:`~crl.losses._tile_math.DIRECT_MAX_LOGIT` the forward sums ``exp(L)`` with no maxima (one
``exp`` and the two sums per entry), and a float32 / float64 backward with no ``exp`` argument
below the floor takes ``G = exp(L_ij) (c_i + t_j)``, ``c = g_row exp(-lse_row)``, ``t = g_col
exp(-lse_col)`` (three passes over each tile: the ``exp``, the broadcast sum, the product;
:data:`DIRECT_BACKWARD`). For narrow inputs the backward can form no ``G``: ``P_row`` comes out
of one product and its ``exp``, and ``G = P_row * (g_row_i + u_i t_j)`` goes into the gradient
products as ``P_row @ [b, t * b]`` and ``P_row.T @ [g_row * a_s, u * a_s]``
(:func:`_add_factored`): more matrix-unit work, two passes over each tile fewer; which route is
faster depends on the machine (:func:`factored_backward` times both once).

Threads: for CPU tiles with no TileMask (any dtype) the row blocks are dealt to side by
side streams, one per intra-op thread (:func:`tile_workers`, :func:`run_streams`), each with one
thread and its own buffers: rows belong to one stream, the columns' log-sum-exps, counts and
``grad_b`` are per stream and merged at the end (in stream order, so the result does not depend
on scheduling). Each core then works on its own tile in its own cache instead of both splitting
every product and pass (bfloat16 at B = 16,384, D = 256: 1.70-1.84 s from one process to the
next, against 1.66-2.85 s as one stream; benchmarks/README.md).

Precision: tile products run in the inputs' dtype. For bfloat16 / float16 inputs the forward's
product tile is widened to float32 before its maxima and ``exp``; log-sum-exps, counts and the
gradient accumulators are float32, ``G`` is an operand of the gradient products in the input dtype
(:class:`~crl.losses._tile_math.TileGradient`) and gradients are returned in the input dtype.
Autocast is switched off inside, so the inputs' dtype decides. float32 and float64 tiles take
each ``exp`` as ``exp2`` of the argument times ``1 / ln 2``, the shift folded into the same pass
(:func:`~crl.losses._tile_math.exp_into`): one more rounding of the argument, of the size it
already carries, for about half the time of ``exp`` on AVX-512 CPUs.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, TypeVar, cast

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from crl.losses._common import masked_logsumexp
from crl.losses._tile_math import (
    DIRECT_MAX_LOGIT,
    LOG2E,
    FactoredTile,
    TileGradient,
    TilePlan,
    direct_operand,
    exp_into,
    logit_bound,
    needs_floor,
    small_rounding,
    spans,
    tile_logsumexps,
    tile_product,
)
from crl.losses._tile_negatives import TileNegatives

#: The narrow-dtype backward's route: None (the default: :func:`factored_backward` times both
#: on one tile, once per process, dtype, tile side and width, for tiles of at least
#: :data:`PROBE_MIN_BLOCK` on CPU; factored tiles otherwise), True (factored tiles,
#: :class:`~crl.losses._tile_math.FactoredTile`: both gradient products twice as wide, two
#: passes over each tile fewer) or False (``G`` formed). Read at each backward, so it can be
#: patched. Both routes are exact to rounding (tested); they differ in the last bits, so a
#: bf16 run that must repeat bit for bit on one machine pins it (the probe may choose
#: differently under load).
FACTORED_BACKWARD: bool | None = None
#: Smaller tiles take the factored route without a probe.
PROBE_MIN_BLOCK = 256
#: Timed calls of each route in the probe (:func:`_probe`); at ``block = 1024``, ``D = 256``
#: each call takes a few milliseconds.
PROBE_REPEATS = 7
#: Whether float32 / float64 backwards take direct tiles where they are exact
#: (:func:`~crl.losses._tile_math.direct_tiles`; ``G = exp(L) (c_i + t_j)``, three passes over
#: each tile instead of five). Read at each backward; False forces the shifted routines
#: (tests compare both).
DIRECT_BACKWARD = True
#: Streams of row blocks run side by side (:func:`tile_workers`): None (the default: one per
#: intra-op thread for CPU tiles with no TileMask, each stream on one thread with its own
#: buffers; measured about 10% faster in float32 than one stream whose products and passes
#: are split across 2 threads, and steadier in bfloat16, benchmarks/README.md) or a count
#: (1: one stream). Read at each forward and backward.
TILE_WORKERS: int | None = None

_T = TypeVar("_T")


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
            bound = logit_bound(a_s, b, acc)
            clamp = needs_floor(bound, n_rows, n_cols, acc)
            # Every |L_ij| <= DIRECT_MAX_LOGIT: exp(L) is a normal number and the sums cannot
            # overflow, so the tile's exps are summed with no maxima (two passes fewer). Narrow
            # inputs also need every |L_ij| <= 1 / (10 u) (u the unit roundoff; 25.6 for bf16).
            direct = bound <= DIRECT_MAX_LOGIT and (a.dtype == acc
                                                    or small_rounding(bound, a.dtype))
            # Wide inputs: the product gives L / ln 2 (the argument of exp2, no scaling pass);
            # the backward's direct tiles recompute it the same way.
            base2 = direct and a.dtype == acc
            a_tile = direct_operand(a_s) if base2 else a_s
            rows_out = (lse_rows, diagonal, count_rows)

            def stream(k: int, workers: int) -> tuple[Tensor, Tensor]:
                """Row blocks ``k, k + workers, ...``: their rows into the shared outputs (no
                two streams share a row), their columns into this stream's own."""
                cols = (lse_cols, count_cols) if k == 0 else (torch.full_like(lse_cols, -math.inf),
                                                               torch.zeros_like(count_cols))
                _forward_rows(a_tile, b, tiles, (block, k, workers), rows_out, cols,
                              (direct, base2, clamp))
                return cols

            workers = tile_workers(a.device, tiles, -(-n_rows // block))
            for k, (part_lse, part_count) in enumerate(run_streams(workers, stream,
                                                                   a.device.type)):
                if k > 0:
                    torch.logaddexp(lse_cols, part_lse, out=lse_cols)
                    count_cols += part_count
        ctx.save_for_backward(a, b, scale, lse_rows, lse_cols)
        ctx.plan = TilePlan(block, tiles, clamp, bound)  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(count_rows, count_cols)
        ctx.set_materialize_grads(False)
        return lse_rows, lse_cols, diagonal, count_rows, count_cols

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_rows: Tensor | None, grad_cols: Tensor | None,
                 grad_diagonal: Tensor | None, *_: Any) -> tuple[Tensor | None, ...]:
        saved = ctx.saved_tensors
        with torch.autocast(saved[0].device.type, enabled=False):
            grads = _backward(saved, ctx.plan, ctx.needs_input_grad[:3],
                              (grad_rows, grad_cols, grad_diagonal))
        return (*grads, None, None, None)


def _forward_rows(a_tile: Tensor, b: Tensor, tiles: TileNegatives, share: tuple[int, int, int],
                  rows_out: tuple[Tensor, Tensor, Tensor], cols_out: tuple[Tensor, Tensor],
                  route: tuple[bool, bool, bool]) -> None:
    """The forward over one stream's row blocks (``share = (block, k, workers)``: blocks ``k,
    k + workers, ...``): per tile, merge its row and column log-sum-exps into ``rows_out =
    (lse_rows, diagonal, count_rows)`` and ``cols_out = (lse_cols, count_cols)`` (``lse_cols``
    empty: no columns). ``route = (direct, base2, clamp)``: sum ``exp(L)`` with no maxima,
    the product gives ``L / ln 2``, clamp ``exp`` arguments at the floor."""
    block, k, workers = share
    lse_rows, diagonal, count_rows = rows_out
    lse_cols, count_cols = cols_out
    direct, base2, clamp = route
    want_cols = lse_cols.numel() > 0
    work_buf = lse_rows.new_empty(block * block)
    logits_buf = lse_rows.new_empty(block * block)
    excluded_buf = (None if tiles.trivial else
                    torch.empty(block * block, dtype=torch.bool, device=a_tile.device))
    ones = lse_rows.new_ones(block)
    row_spans = list(spans(a_tile.shape[0], block))[k::workers]
    for r0, r1 in row_spans:
        for c0, c1 in spans(b.shape[0], block):
            h, w = r1 - r0, c1 - c0
            logits = tile_product(a_tile, b, r0, r1, c0, c1, logits_buf, work_buf)
            excluded = (None if excluded_buf is None else
                        tiles.excluded(r0, r1, c0, c1, excluded_buf[: h * w].view(h, w)))
            lo, hi, diag = tiles.positives(r0, r1, c0, c1)
            if hi > lo:
                if base2:
                    torch.mul(logits.diagonal(diag), 1.0 / LOG2E, out=diagonal[lo:hi])
                else:
                    diagonal[lo:hi] = logits.diagonal(diag)
            if excluded is None:
                count_rows[r0:r1] += w
                count_cols[c0:c1] += h
            else:
                logits.masked_fill_(excluded, -math.inf)
                count_rows[r0:r1] += w - excluded.sum(dim=1)
                count_cols[c0:c1] += h - excluded.sum(dim=0)
            if direct:
                # (h, w), every entry in range
                e = logits.exp2_() if base2 else exp_into(logits, None, logits, None)
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


def tile_workers(device: torch.device, tiles: TileNegatives, row_blocks: int) -> int:
    """How many streams of row blocks the kernel runs side by side: :data:`TILE_WORKERS` when
    set; else torch's intra-op thread count for tiles on the CPU with no
    :class:`~crl.losses.TileMask` (user code, which need not be thread-safe); 1 otherwise; never
    more than ``row_blocks``."""
    if TILE_WORKERS is not None:
        wanted = TILE_WORKERS
    elif device.type != "cpu" or tiles.tile_mask is not None:
        wanted = 1
    else:
        wanted = torch.get_num_threads()
    return max(1, min(wanted, row_blocks))


def run_streams(workers: int, stream: Callable[[int, int], _T], device_type: str) -> list[_T]:
    """``[stream(k, workers) for k in range(workers)]``, side by side: stream 0 on this
    thread, the others on threads of their own, each with one intra-op thread (torch's thread
    count is set to 1 for the duration and restored; streams own their buffers, so none waits
    on another's). Gradients are off and autocast is off in every stream, as in the caller."""

    def guarded(k: int) -> _T:
        with torch.no_grad(), torch.autocast(device_type, enabled=False):
            return stream(k, workers)

    if workers == 1:
        return [guarded(0)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=workers - 1) as pool:
            others = [pool.submit(guarded, k) for k in range(1, workers)]
            first = guarded(0)
            return [first, *(future.result() for future in others)]
    finally:
        torch.set_num_threads(threads)


def _backward(saved: tuple[Tensor, ...], plan: TilePlan, needs: tuple[bool, ...],
              incoming: tuple[Tensor | None, Tensor | None, Tensor | None]
              ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The gradients of ``a``, ``b`` and ``scale`` (module docstring, **backward**;
    docs/theory.md §12), one accumulator loop over the tiles.

    With ``G`` of each tile from :class:`~crl.losses._tile_math.TileGradient` and ``g_diag``
    the positives' gradient, ``acc_a = sum_tiles G @ b[C] + g_diag * b[offset + i]``:
    ``grad_a = scale * acc_a``, ``grad_b = sum_tiles G.T @ a_s[R]`` (plus ``g_diag * a_s`` at
    the positives) and ``grad_scale = sum_i a_i . acc_a_i`` (per anchor for an ``(h,)`` scale).

    Args:
        saved: ``(a (h, D), b (W, D), scale, lse_rows (h,), lse_cols (W,) or empty)``.
        plan: From the forward.
        needs: Whether ``a``, ``b``, ``scale`` need a gradient.
        incoming: The gradients of ``lse_rows``, ``lse_cols`` and the positive logits, each
            None when that output was not used.
    """
    a, b, scale, lse_rows, lse_cols = saved
    need_a, need_b, need_scale = needs
    grad_rows, grad_cols, grad_diagonal = incoming
    if lse_cols.numel() == 0:
        grad_cols = None
    acc = scale.dtype
    a_s = scaled(a, scale)  # (h, D)
    acc_a = torch.zeros(a.shape, dtype=acc, device=a.device)  # sum_j G_ij b_j
    acc_b = torch.zeros(b.shape, dtype=acc, device=a.device)  # sum_i G_ij scale_i a_i
    if grad_rows is not None or grad_cols is not None:
        row_spans = list(spans(a.shape[0], plan.block))
        workers = tile_workers(a.device, plan.tiles, len(row_spans))
        factored = a.dtype != acc and factored_backward(a.device, a.dtype, plan.block,
                                                        a.shape[1], workers=workers)
        tile_gradient = TileGradient(a_s, b, (lse_rows, lse_cols), plan, (grad_rows, grad_cols),
                                     factored, DIRECT_BACKWARD)

        def stream(k: int, workers: int) -> Tensor:
            """Row blocks ``k, k + workers, ...`` into ``acc_a`` (rows no other stream has)
            and this stream's own ``acc_b``."""
            own = tile_gradient if k == 0 else tile_gradient.with_own_buffers()
            part_b = acc_b if k == 0 else torch.zeros_like(acc_b)
            for r0, r1 in row_spans[k::workers]:
                for c0, c1 in spans(b.shape[0], plan.block):
                    _tile_step(own, (r0, r1, c0, c1), acc_a if need_a or need_scale else None,
                               part_b if need_b else None, a_s, b)
            return part_b

        for part_b in run_streams(workers, stream, a.device.type)[1:]:
            acc_b += part_b
    if grad_diagonal is not None:
        own = slice(plan.tiles.offset, plan.tiles.offset + a.shape[0])  # the rows' positives
        acc_a.addcmul_(grad_diagonal.unsqueeze(1), b[own].to(acc))
        acc_b[own].addcmul_(grad_diagonal.unsqueeze(1), a_s.to(acc))
    grad_a = scaled(acc_a, scale).to(a.dtype) if need_a else None
    grad_b = acc_b.to(b.dtype) if need_b else None
    grad_scale = None
    if need_scale:
        products = a.to(acc) * acc_a
        grad_scale = products.sum(dim=1) if scale.dim() == 1 else products.sum()
    return grad_a, grad_b, grad_scale


def _tile_step(tile_gradient: TileGradient, span: tuple[int, int, int, int],
               acc_a: Tensor | None, acc_b: Tensor | None, a_s: Tensor, b: Tensor) -> None:
    """One tile of the backward: ``acc_a[R] += G @ b[C]`` and ``acc_b[C] += G.T @ a_s[R]``
    (either None: not needed; ``grad_scale`` is read off ``acc_a``)."""
    r0, r1, c0, c1 = span
    g = tile_gradient(r0, r1, c0, c1)  # (h, w), in the inputs' dtype, or its factors
    if isinstance(g, FactoredTile):
        _add_factored(None if acc_a is None else acc_a[r0:r1],
                      None if acc_b is None else acc_b[c0:c1], g, a_s[r0:r1], b[c0:c1])
        return
    if acc_a is not None:
        _add_product(acc_a[r0:r1], g, b[c0:c1])
    if acc_b is not None:
        _add_product(acc_b[c0:c1], g.T, a_s[r0:r1])


def factored_backward(device: torch.device, dtype: torch.dtype, block: int, dim: int, *,
                      workers: int = 1) -> bool:
    """Whether the narrow-dtype backward takes factored tiles: :data:`FACTORED_BACKWARD` when
    set, True for tiles smaller than :data:`PROBE_MIN_BLOCK` or off the CPU, else the faster
    route on one ``block x block`` tile of unit vectors at ``tau = 0.07`` on the intra-op
    threads a backward of ``workers`` streams gives each stream (:func:`run_streams`: one with
    several streams, torch's count with one), timed by :func:`_probe` once per process for each
    dtype, tile side, width ``dim`` and thread count.

    The factored route does twice the gradient products' matrix work to save passes over the
    tile; measured at B = 16,384, D = 256 in bfloat16 it was the faster where the bf16 product
    ran at 830-860 GFLOP/s and about 30% slower where it ran at 415 (benchmarks/README.md)."""
    if FACTORED_BACKWARD is not None:
        return FACTORED_BACKWARD
    if block < PROBE_MIN_BLOCK or device.type != "cpu":
        return True
    return _probe(dtype, block, dim, 1 if workers > 1 else torch.get_num_threads())


@functools.cache
@torch.no_grad()
def _probe(dtype: torch.dtype, block: int, dim: int, threads: int) -> bool:
    """True when one tile's backward step on ``threads`` intra-op threads is faster factored:
    the fastest of :data:`PROBE_REPEATS` timed calls of each route, taken in turns after one
    untimed call of each (so a burst of load on a shared machine slows both routes' calls, not
    one route's); the tile's own log-sum-exps and gradients of 1. torch's thread count is
    restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _time_routes(dtype, block, dim)
    finally:
        torch.set_num_threads(previous)


def _time_routes(dtype: torch.dtype, block: int, dim: int) -> bool:
    """:func:`_probe`'s timing on the current thread count."""
    gen = torch.Generator().manual_seed(0)
    a = torch.nn.functional.normalize(torch.randn(block, dim, generator=gen), dim=1)
    b = torch.nn.functional.normalize(torch.randn(block, dim, generator=gen), dim=1)
    scale = torch.tensor(1 / 0.07)
    a_s, b = scaled(a, scale).to(dtype), b.to(dtype)
    logits = (a_s @ b.T).float()
    lse = (torch.logsumexp(logits, dim=1), torch.logsumexp(logits, dim=0))
    ones = torch.ones(block)
    bound = logit_bound(a_s, b, torch.float32)
    plan = TilePlan(block, TileNegatives(None, None, None, None, include_positive=True,
                                         offset=0), needs_floor(bound, block, block,
                                                                torch.float32), bound)
    acc_a, acc_b = torch.zeros(block, dim), torch.zeros(block, dim)
    routes = {factored: TileGradient(a_s, b, lse, plan, (ones, ones), factored)
              for factored in (True, False)}
    best = {factored: math.inf for factored in routes}
    for turn in range(PROBE_REPEATS + 1):
        for factored, tile_gradient in routes.items():
            start = time.perf_counter()
            _tile_step(tile_gradient, (0, block, 0, block), acc_a, acc_b, a_s, b)
            if turn:  # the first call of each route is untimed
                best[factored] = min(best[factored], time.perf_counter() - start)
    return best[True] <= best[False]


def _add_product(acc: Tensor, g: Tensor, y: Tensor) -> None:
    """``acc += g @ y``; a ``g`` narrower than ``acc`` is multiplied in its dtype."""
    if g.dtype == acc.dtype:
        acc.addmm_(g, y)
    else:
        acc.add_(torch.mm(g, y))


def _add_factored(acc_a: Tensor | None, acc_b: Tensor | None, tile: FactoredTile,
                  a_s: Tensor, b: Tensor) -> None:
    """``acc_a += G @ b`` and ``acc_b += G.T @ a_s`` for ``G = P * (w_i + u_i t_j)``
    (:class:`~crl.losses._tile_math.FactoredTile`), ``G`` unformed: ``G @ b = w * (P @ b) +
    u * (P @ (t * b))`` and ``G.T @ a_s = P.T @ (w * a_s) + t * (P.T @ (u * a_s))``, each pair
    one product with the operands side by side (``(w, 2D)``; ``(w, D)`` without ``u, t``)."""
    p, w, u, t = tile
    dim = b.shape[1]
    if acc_a is not None:
        right = b if t is None else torch.cat([b, (t.unsqueeze(1) * b).to(b.dtype)], dim=1)
        both = torch.mm(p, right)  # (h, D) or (h, 2D)
        acc_a.addcmul_(both[:, :dim], w.unsqueeze(1))
        if u is not None:
            acc_a.addcmul_(both[:, dim:], u.unsqueeze(1))
    if acc_b is not None:
        left = (w.unsqueeze(1) * a_s).to(a_s.dtype)
        if u is not None:
            left = torch.cat([left, (u.unsqueeze(1) * a_s).to(a_s.dtype)], dim=1)
        both = torch.mm(p.T, left)  # (w, D) or (w, 2D)
        acc_b.add_(both[:, :dim])
        if t is not None:
            acc_b.addcmul_(both[:, dim:], t.unsqueeze(1))


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
