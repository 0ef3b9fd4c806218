"""The held-out contrastive risk, computed over blocks of anchors (THEORY.md section 1)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from crl._validation import check_int_range, check_pair, check_positive


def heldout_contrastive_risk(a: Tensor, b: Tensor, *, temperature: float,
                             block_size: int = 4096) -> float:
    """The positive-excluded contrastive risk with every other item as a negative.

    ``(1/N) sum_i tau log( (1/(N-1)) sum_{j != i} exp((s_ij - s_ii) / tau) )`` with
    ``s = a @ b.T``, in float64, ``block_size`` anchors at a time (memory ``O(block_size x N)``).
    Equals :func:`crl.losses.contrastive_risk` on the whole set.

    Args:
        a: ``(N, D)`` anchors.
        b: ``(N, D)`` positives.
        temperature: ``tau > 0``.
        block_size: Anchors scored at once.

    Returns:
        A float.

    Example:
        >>> round(heldout_contrastive_risk(torch.eye(3), torch.eye(3), temperature=1.0), 6)
        -1.0
    """
    where = "heldout_contrastive_risk"
    a, b = check_pair(where, a, b)
    check_positive(where, "temperature", temperature, allow_tensor=False)
    check_int_range(where, "block_size", block_size, 1, None)
    a, b = a.detach().double(), b.detach().double()
    n = a.shape[0]
    total = 0.0
    for start in range(0, n, block_size):
        stop = min(start + block_size, n)
        scores = a[start:stop] @ b.T  # (Q, N)
        rows = torch.arange(stop - start)
        delta = (scores - scores[rows, rows + start].unsqueeze(1)) / temperature
        delta[rows, rows + start] = float("-inf")  # the positive is excluded
        total += float((temperature * (torch.logsumexp(delta, dim=1) - math.log(n - 1))).sum())
    return total / n


__all__ = ["heldout_contrastive_risk"]
