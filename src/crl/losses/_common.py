"""Numerical building blocks of the losses (log-sum-exp over masked rows)."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_logsumexp(x: Tensor, mask: Tensor | None, dim: int = -1) -> Tensor:
    """``log sum_{j: mask_j} exp(x_j)`` along ``dim``, max-subtracted so it never overflows.

    Args:
        x: Scores of any shape.
        mask: Bool tensor broadcastable to ``x`` (None: every entry counts). Rows with no True
            entry give ``-inf``; callers check masks before this point.
        dim: The reduced dimension.

    Returns:
        ``x`` with ``dim`` reduced.
    """
    if mask is None:
        return torch.logsumexp(x, dim=dim)
    neg_inf = torch.finfo(x.dtype).min
    filled = x.masked_fill(~mask, neg_inf)
    # The max is taken over selected entries only; it is a constant for the gradient.
    peak = filled.amax(dim=dim, keepdim=True).detach()
    peak = torch.where(torch.isfinite(peak) & (peak > neg_inf), peak, torch.zeros_like(peak))
    summed = (torch.exp(filled - peak) * mask).sum(dim=dim, keepdim=True)
    return (torch.log(summed) + peak).squeeze(dim)


def off_diagonal(n: int, device: torch.device | None = None) -> Tensor:
    """The ``(n, n)`` bool mask that is True off the diagonal (every ``j != i``)."""
    return ~torch.eye(n, dtype=torch.bool, device=device)
