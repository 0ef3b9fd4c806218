"""Numerical building blocks of the losses (log-sum-exp over masked rows)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor


def masked_logsumexp(x: Tensor, mask: Tensor | None, dim: int = -1) -> Tensor:
    """``log sum_{j: mask_j} exp(x_j)`` along ``dim``, max-subtracted so it never overflows.

    The left-out entries are removed by arithmetic, not by ``masked_fill``: ``x - peak`` is
    multiplied by the 0/1 mask before the exponential, so they enter it as ``exp(0)`` and are
    then multiplied by 0. The selected entries see exactly ``exp(x - peak)``, as with a fill
    of ``-inf``, and their gradients are the same to the bit; but the exponential never meets
    the huge negative arguments that take the CPU's slow path (about 50x slower in float32,
    and a masked fill of a bool mask is itself slower than a product).

    Args:
        x: Scores of any shape, finite (also where left out: a product with 0 keeps an inf).
        mask: Bool tensor broadcastable to ``x`` (None: every entry counts). Rows with no True
            entry give ``-inf``; callers check masks before this point.
        dim: The reduced dimension.

    Returns:
        ``x`` with ``dim`` reduced.

    Example:
        >>> x = torch.tensor([[0.0, 1.0, 5.0], [2.0, 3.0, 4.0]])
        >>> mask = torch.tensor([[True, True, False], [False, False, False]])
        >>> [round(v, 4) for v in masked_logsumexp(x, mask, dim=1).tolist()]  # log(1 + e)
        [1.3133, -inf]
    """
    if mask is None:
        return torch.logsumexp(x, dim=dim)
    keep = mask.to(x.dtype)
    some = keep.amax(dim=dim, keepdim=True) > 0  # (a float reduction: faster than any())
    # The max over the selected entries (the others pushed below every finite score); a
    # constant for the gradient, 0 for a row with none selected.
    peak = (x - (1.0 - keep) * torch.finfo(x.dtype).max).amax(dim=dim, keepdim=True).detach()
    peak = torch.where(some, peak, torch.zeros_like(peak))
    summed = (torch.exp((x - peak) * keep) * keep).sum(dim=dim, keepdim=True)
    # A row with none selected is -inf, with a zero gradient (not 0 * log'(0))
    out = torch.where(some, torch.log(torch.where(some, summed, torch.ones_like(summed))) + peak,
                      torch.full_like(summed, -math.inf))
    return out.squeeze(dim)


def anchor_negatives(mask: Tensor | None, rows: slice, width: int,
                     device: torch.device) -> Tensor:
    """``(h, W)`` bool: the negatives of the anchors ``rows`` of a batch among its ``W``
    candidates, ``mask`` (the rows' ``(h, W)`` mask; None: every candidate) without each
    anchor's positive, candidate ``rows.start + i`` (a new tensor).

    Example:
        >>> anchor_negatives(None, slice(1, 3), 3, torch.device("cpu")).long().tolist()
        [[1, 0, 1], [1, 1, 0]]
    """
    h = rows.stop - rows.start
    out = (torch.ones(h, width, dtype=torch.bool, device=device) if mask is None
           else mask.to(device=device, copy=True))
    own = torch.arange(h, device=device)
    out[own, own + rows.start] = False
    return out


def off_diagonal(n: int, device: torch.device | None = None) -> Tensor:
    """The ``(n, n)`` bool mask that is True off the diagonal (every ``j != i``)."""
    return ~torch.eye(n, dtype=torch.bool, device=device)


def info_nce_rows(logits: Tensor, candidates: Tensor, offset: int = 0,
                  extra: Tensor | None = None, extra_mask: Tensor | None = None) -> Tensor:
    """``(h,)`` per-anchor InfoNCE: ``log sum_{candidates} exp(logits) - logits[i, offset + i]``
    of ``logits (h, B)`` over the ``candidates (h, B)`` mask (the positive included), with the
    ``(h, H)`` ``extra`` logits as further candidates of their rows (hard negatives; those
    of the ``(h, H)`` ``extra_mask``, None: all).

    Example:
        >>> logits = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> info_nce_rows(logits, torch.tensor([[True, True], [False, True]]))
        tensor([0.3133, 0.0000])
    """
    own = torch.arange(logits.shape[0], device=logits.device)
    if extra is None:
        lse = masked_logsumexp(logits, candidates, dim=1)
    else:
        lse = masked_logsumexp(torch.cat([logits, extra], dim=1),  # (h, B + H)
                               torch.cat([candidates, candidates.new_ones(extra.shape)
                                          if extra_mask is None else extra_mask], dim=1),
                               dim=1)
    return lse - logits[own, own + offset]  # after the lse: the gradients add up in that order


def other_direction(first: Tensor, x: Tensor, y: Tensor, rows: slice, whole: bool,
                    logits_of: Callable[[Tensor], Tensor] = lambda s: s) -> Tensor:
    """The ``(h, B)`` logits of the ``b -> a`` direction for the anchors ``rows``, given those
    of ``a -> b``, ``first = logits_of(x[rows] @ y.T)``: for the whole batch the transpose of
    ``first`` (one product), else ``logits_of(y[rows] @ x.T)``.

    Example:
        >>> x, y = torch.eye(3), torch.arange(9.0).reshape(3, 3)
        >>> other_direction(x[2:] @ y.T, x, y, slice(2, 3), whole=False).tolist()
        [[6.0, 7.0, 8.0]]
    """
    return first.T if whole else logits_of(y[rows] @ x.T)


def hard_scores(anchors: Tensor, hard: Tensor) -> Tensor:
    """``(h, H)``: each anchor ``anchors (h, D)`` against its own hard negatives ``(h, H, D)``."""
    return torch.bmm(hard.to(anchors.dtype), anchors.unsqueeze(2)).squeeze(2)  # (h, H, 1) -> (h, H)


def expand_counted(values: Tensor, counted: Tensor, size: int) -> Tensor:
    """``(size,)``: ``values (A,)`` of the counted anchors at their places, 0 elsewhere (the
    reducer reads back exactly ``values``, so the sum is unchanged)."""
    return values.new_zeros(size).masked_scatter(counted, values)
