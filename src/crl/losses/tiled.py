"""Exact contrastive log-sum-exps over tiles of the score matrix, in ``O((h + W) D + T²)`` memory.

One public primitive, :func:`anchor_logsumexp`: a block of anchors against all candidates, the
positive of anchor ``i`` at column ``offset + i``, the negatives from a dense mask or a
:class:`TileMask` (such as :class:`crl.negatives.NegativeSets`, asked tile by tile from dataset
indices, so no ``B²`` object is built), optional per-anchor extra candidates (hard negatives).
InfoNCE, the CLIP loss (``info_nce`` / ``clip_loss`` tiled, both directions from one
pass over the tiles), GCL, the held-out risk and the uniformity metric are written on it. The
kernel and its derivation live in :mod:`crl.losses._tiled_kernel`; results equal the plain
``(B, B)`` computations up to floating-point rounding (``docs/theory.md`` §12, the losses §8).

bfloat16 / float16 embeddings keep their dtype for the tile products (about twice the float32
matmul speed on CPUs with bf16 units); maxima, log-sum-exps and gradient accumulators are float32,
gradients come back in the input dtype.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

from crl._validation import check_int_range, describe
from crl.errors import CrlTypeError, CrlValueError
from crl.losses._common import masked_logsumexp
from crl.losses._tile_checks import (
    check_anchor_inputs,
    check_index,
    check_row_counts,
    scale_tensor,
    tile_dtypes,
)
from crl.losses._tile_negatives import TileMask, TileNegatives
from crl.losses._tiled_kernel import (
    plain_logsumexp,
    scaled,
    tiled_logsumexp,
)

#: ``block_size`` of the losses and the kernel: None (automatic: the plain path up to
#: :data:`PLAIN_MAX_BATCH`, tiles of :data:`DEFAULT_BLOCK_SIZE` above), ``"plain"`` (the plain
#: path at any size) or the side of the tiles.
BlockSize = int | Literal["plain"] | None
#: What :func:`decide_tiles` decided: ``"plain"`` (the ``(h, W)`` logits built whole) or the side
#: ``T`` of the ``T x T`` tiles they are visited in.
Tiles = int | Literal["plain"]
#: Tile side used when ``block_size`` is None. Three ``(T, T)`` buffers (12 MiB in float32), so a
#: tile's element-wise passes run in the CPU's caches while its ``(T, D) @ (D, T)`` product still
#: runs at the full product's rate (profiled at B = 16,384: the products 94% of the time).
#: Measured (``crl bench loss --dtype bf16 --block-size T``, B = 16,384, D = 256, 2 cores, each
#: run a fresh process, 2026-12-06; benchmarks/results/loss_bf16_block_sweep.json): float32 at a
#: median 88% of the 4096² product with T = 1024 (14 runs, 83-92%) against 83% with 4096 (3 runs)
#: and 86% with 2048; bfloat16 at a median 55% of its product with 1024 against 50% with 4096.
DEFAULT_BLOCK_SIZE = 1024
#: ``block_size=None`` builds the plain scores up to this batch size (``h * W <=
#: PLAIN_MAX_BATCH²``) and uses tiles above it (measured: tiles win from about ``B = 2048`` on
#: CPU); read by :func:`decide_tiles` at each call.
PLAIN_MAX_BATCH = 2048
#: A :class:`TileMask` block of at most this many entries (64 MiB of bool) is evaluated once
#: per call, in row chunks, and kept dense (:func:`densify`): both directions of a loss and the
#: backward pass then read it instead of asking the mask again for every tile and pass.
DENSE_MASK_MAX_ENTRIES = 1 << 26


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


def tile_negatives(where: str, negatives_mask: object, *, h: int, width: int, offset: int,
                   include_positive: bool, anchor_index: Tensor | None = None,
                   candidate_index: Tensor | None = None, device: torch.device,
                   require_negatives: bool = False, check: bool = True) -> TileNegatives:
    """The one way from a user's negatives to the kernel's tiles, checked.

    Args:
        where: The public function, for messages.
        negatives_mask: None (every column but the positive), an ``(h, W)`` bool tensor
            (``[i, j]``: candidate ``j`` is a negative of anchor ``i``; the positive's entry is
            ignored) or a :class:`TileMask`, asked with ``anchor_index`` (default
            ``arange(offset, offset + h)``) and ``candidate_index`` (default ``arange(W)``) and
            made dense once (:func:`densify`) when the block is not huge.
        h, width: Anchors and candidates.
        offset: Column of anchor 0's positive.
        include_positive: Whether the positive is a candidate.
        device: The embeddings' device.
        require_negatives: Reject a dense mask with a row that has no negative.
        check: False: trust the mask and indices (no checks; the trainer's batches).

    Raises:
        CrlTypeError / CrlValueError: naming ``where`` and the argument.
    """
    if negatives_mask is None:
        return TileNegatives(None, None, None, None, include_positive=include_positive,
                             offset=offset)
    if isinstance(negatives_mask, Tensor):
        dense = negatives_mask
        if not check:
            return TileNegatives(dense.to(device), None, None, None,
                                 include_positive=include_positive, offset=offset)
        if dense.dtype != torch.bool:
            raise CrlTypeError(f"{where}: `negatives_mask` must have dtype torch.bool; got "
                               f"{dense.dtype}")
        if tuple(dense.shape) != (h, width):
            raise CrlValueError(f"{where}: `negatives_mask` must have shape {(h, width)}; "
                                f"got {tuple(dense.shape)}")
        dense = dense.to(device)
    elif isinstance(negatives_mask, TileMask):
        rows = (torch.arange(offset, offset + h, device=device) if anchor_index is None
                else check_index(where, "anchor_index", anchor_index, h, device) if check
                else anchor_index.to(device))
        cols = (torch.arange(width, device=device) if candidate_index is None
                else check_index(where, "candidate_index", candidate_index, width, device)
                if check else candidate_index.to(device))
        block = densify(negatives_mask, rows, cols)
        if not isinstance(block, Tensor):
            return TileNegatives(None, negatives_mask, rows, cols,
                                 include_positive=include_positive, offset=offset)
        if not check:
            return TileNegatives(block.to(device), None, None, None,
                                 include_positive=include_positive, offset=offset)
        shape = (h, width)
        if block.dtype != torch.bool or tuple(block.shape) != shape:
            raise CrlValueError(f"TileMask.mask: must return a bool tensor of shape {shape} "
                                f"for {h} anchors and {width} candidates; got {describe(block)}")
        dense = block.to(device)
    else:
        raise CrlTypeError(f"{where}: `negatives_mask` must be None, an {(h, width)} bool tensor "
                           f"or an object with a `mask(rows_index, cols_index)` method (a "
                           f"TileMask); got {describe(negatives_mask)}")
    if require_negatives:
        own = torch.arange(h, device=device)
        has = dense.clone()
        has[own, own + offset] = False
        check_row_counts(where, has.sum(dim=1) + 1)  # + the positive
    return TileNegatives(dense, None, None, None, include_positive=include_positive,
                         offset=offset)


def check_block_size(where: str, block_size: object) -> BlockSize:
    """``block_size`` checked: None, ``"plain"`` or an int >= 1."""
    if block_size is None:
        return None
    if block_size == "plain":
        return "plain"
    if isinstance(block_size, str):
        raise CrlTypeError(f"{where}: `block_size` must be None (automatic), 'plain' or an "
                           f"integer >= 1 (the tile side); got {block_size!r}")
    return check_int_range(where, "block_size", block_size, 1, None)


def decide_tiles(where: str, block_size: object, h: int, width: int) -> Tiles:
    """Plain or tiled, for ``h`` anchors against ``width`` candidates: the one place it is
    decided (the losses read the result from :attr:`crl.losses.PairBatch.tiles`).

    The plain path builds the ``(h, W)`` logits; tiles visit them ``T x T`` at a time in
    ``O((h + W) D + T²)`` memory, with the same values and gradients (docs/theory.md §12).

    Args:
        where: The caller, for messages.
        block_size: ``"plain"``; an int: tiles of that side (at most ``max(h, W)``); None:
            plain while ``h * W <= PLAIN_MAX_BATCH²`` (read now, so it can be patched), else
            tiles of :data:`DEFAULT_BLOCK_SIZE`.
        h, width: Anchors and candidates.

    Returns:
        ``"plain"`` or the tile side ``T``.

    Raises:
        CrlTypeError / CrlValueError: for a ``block_size`` that is none of those.

    Example:
        >>> decide_tiles("f", None, 8, 8), decide_tiles("f", 3, 8, 8), decide_tiles("f", 64, 8, 8)
        ('plain', 3, 8)
    """
    block_size = check_block_size(where, block_size)
    if block_size == "plain" or (block_size is None and h * width <= PLAIN_MAX_BATCH ** 2):
        return "plain"
    if block_size is None:
        return max(1, min(DEFAULT_BLOCK_SIZE, max(h, width)))
    return min(block_size, max(h, width))


def pair_loss(where: str, a: Tensor, b: Tensor, *, temperature: float | Tensor | None = None,
              scale: float | Tensor | None = None, symmetric: bool,
              negatives_mask: object = None, index: Tensor | None = None,
              tile: int) -> Tensor:
    """InfoNCE of the pairs ``a[i], b[i]`` over ``tile x tile`` tiles (``info_nce`` /
    ``clip_loss`` when :func:`decide_tiles` says so): the mean over anchors of ``lse_i - L_ii``,
    and with ``symmetric`` the mean of both directions, the second from the same tiles' columns
    and the transposed mask.

    ``a``, ``b``: ``(B, D)`` pairs (checked by the caller); ``temperature`` (``tau``) or
    ``scale`` (``1 / tau``), one of them; ``index``: the ``(B,)`` dataset indices for a
    :class:`TileMask`. The rest is checked here.
    """
    batch = a.shape[0]
    prod, acc = tile_dtypes(a, b)
    a, b = a.to(prod), b.to(prod)
    if temperature is not None:
        scale_t = 1.0 / scale_tensor(where, "temperature", temperature, batch, acc, a.device,
                                      per_anchor=False)
    else:
        scale_t = scale_tensor(where, "scale", scale, batch, acc, a.device, per_anchor=False)
    if index is not None:
        index = check_index(where, "index", index, batch, a.device)
    tiles = tile_negatives(where, negatives_mask, h=batch, width=batch, offset=0,
                           include_positive=True, anchor_index=index, candidate_index=index,
                           device=a.device, require_negatives=True)
    out = tiled_logsumexp(a, b, scale_t, tile, tiles, symmetric)
    if tiles.tile_mask is not None:
        check_row_counts(where, out.count_rows)
    loss = (out.lse_rows - out.positive).mean()
    if symmetric:
        loss = 0.5 * (loss + (out.lse_cols - out.positive).mean())
    return loss


def dense_mask(where: str, negatives_mask: Tensor | TileMask | None, index: Tensor | None,
               batch: int, device: torch.device) -> Tensor | None:
    """A :class:`TileMask` as the dense ``(B, B)`` mask of the batch (for a plain path)."""
    if index is not None:
        index = check_index(where, "index", index, batch, device)
    if not isinstance(negatives_mask, Tensor) and isinstance(negatives_mask, TileMask):
        rows = index if index is not None else torch.arange(batch, device=device)
        return negatives_mask.mask(rows, rows)
    return negatives_mask


class AnchorLogSumExp(NamedTuple):
    """Per-anchor log-sum-exps of anchors against candidates, from :func:`anchor_logsumexp`.

    Attributes:
        lse: ``(h,)`` float: ``log sum_{j in C(i)} exp(L_ij)`` over anchor ``i``'s candidates
            ``C(i)`` (``-inf`` and no gradient for an anchor with none), ``L = scale * anchors @
            candidates.T``; float32 for bfloat16 / float16 inputs.
        positive: ``(h,)``: ``L[i, offset + i]``, the logit of anchor ``i``'s positive.
        counts: ``(h,)`` int64: ``|C(i)|`` (extra candidates included).
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
    block_size: BlockSize = None,
    extra: Tensor | None = None,
    check: bool = True,
    extra_mask: Tensor | None = None,
) -> AnchorLogSumExp:
    """Log-sum-exps of some anchors against all candidates, the positive of anchor ``i`` being
    candidate ``offset + i``: the local rows of a distributed batch against the gathered columns.

    With ``L = scale * anchors @ candidates.T`` ``(h, W)``, anchor ``i``'s candidates ``C(i)``
    are its negatives (``negatives_mask``, default every column but its positive), its ``H``
    ``extra`` candidates (hard negatives: its own, never another anchor's) and, when
    ``include_positive``, its positive. InfoNCE of anchor ``i`` is ``lse[i] - positive[i]``;
    GCL's ``log g_hat_i`` is ``lse[i] - positive[i] - log counts[i]`` with
    ``include_positive=False``. In a process group of ``N`` ranks with ``h = B / N`` local rows,
    rank ``r`` passes its rows, all gathered columns and ``offset = r * h``.

    Small problems (``h * W <= PLAIN_MAX_BATCH²`` and no ``block_size``) build ``L``; larger ones
    (or an int ``block_size``) visit it in ``T x T`` tiles in ``O((h + W) D + T²)`` memory, with
    the same values and gradients (:func:`decide_tiles`). bfloat16 / float16 inputs are
    multiplied in their dtype and reduced in float32.

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
        block_size: Tile side ``T``; ``"plain"``: ``L`` built whole; None: tiles only for large
            problems.
        extra: ``(h, H, D)`` extra candidates of each anchor (``H >= 0``), scored
            ``scale_i * anchors[i] . extra[i, k]``; differentiable.
        extra_mask: ``(h, H)`` bool: which extra candidates count (None: all; unchecked).
        check: Check the arguments (the default). False skips every check, including those
            that read tensor values and so wait for the device (finiteness, positive scales,
            dataset indices): for callers whose inputs are valid by construction, such as the
            training objectives' :meth:`~crl.losses.base.PairLoss.terms`.

    Returns:
        :class:`AnchorLogSumExp` ``(lse, positive, counts)``.

    Raises:
        CrlValueError / CrlTypeError: on bad shapes, NaN/Inf, a non-positive scale, an offset
            that puts a positive outside the candidates, a bad mask, index, ``extra`` or
            ``block_size``.

    Example:
        >>> anchors, candidates = torch.eye(4)[2:], torch.eye(4)  # rows 2 and 3 of a batch of 4
        >>> out = anchor_logsumexp(anchors, candidates, 1.0, offset=2)
        >>> out.positive.tolist(), out.counts.tolist()
        ([1.0, 1.0], [4, 4])
        >>> round(float(out.lse[0] - out.positive[0]), 4)  # InfoNCE: log(e + 3) - 1
        0.7437
        >>> extra = anchors[:, None]  # (2, 1, 4): one hard negative each, scoring 1
        >>> hard = anchor_logsumexp(anchors, candidates, 1.0, offset=2, extra=extra)
        >>> hard.counts.tolist(), round(float(hard.lse[0] - hard.positive[0]), 4)  # log(2e + 3) - 1
        ([5, 5], 1.1326)
    """
    where = "anchor_logsumexp"
    if check:
        check_anchor_inputs(where, anchors, candidates, offset, extra)
    h, width = anchors.shape[0], candidates.shape[0]
    prod, acc = tile_dtypes(anchors, candidates, *([] if extra is None else [extra]))
    anchors, candidates = anchors.to(prod), candidates.to(prod)
    device = anchors.device
    scale_t = scale_tensor(where, "scale", scale, h, acc, device, per_anchor=True, check=check)
    tiles = tile_negatives(where, negatives_mask, h=h, width=width, offset=offset,
                           include_positive=include_positive, anchor_index=anchor_index,
                           candidate_index=candidate_index, device=device, check=check)
    tile = decide_tiles(where, block_size, h, width)
    if tile != "plain":
        out = tiled_logsumexp(anchors, candidates, scale_t, tile, tiles, False)
        lse, positive, counts = out.lse_rows, out.positive, out.count_rows
    else:
        lse, positive, counts = plain_logsumexp(anchors, candidates, scale_t, tiles)
    if extra is not None and extra.shape[1] > 0:
        # (h, H, D) @ (h, D, 1) -> (h, H): anchor i against its own extra candidates only
        scores = torch.bmm(extra.to(prod), scaled(anchors, scale_t).unsqueeze(2)).squeeze(2)
        if extra_mask is None:
            lse = torch.logaddexp(lse, torch.logsumexp(scores.to(acc), dim=1))
            counts = counts + extra.shape[1]
        else:  # a row with none left adds exp(-huge) = 0, with no NaN in the gradient
            kept = masked_logsumexp(scores.to(acc), extra_mask, dim=1)
            lse = torch.logaddexp(lse, kept.clamp(min=torch.finfo(acc).min))
            counts = counts + extra_mask.sum(dim=1)
    return AnchorLogSumExp(lse, positive, counts)


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "PLAIN_MAX_BATCH",
    "AnchorLogSumExp",
    "BlockSize",
    "TileMask",
    "Tiles",
    "anchor_logsumexp",
    "decide_tiles",
]
