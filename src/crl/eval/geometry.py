"""Alignment and uniformity of normalised embeddings (Wang and Isola, ICML 2020)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from crl._validation import check_int_range, check_pair, check_positive, check_tensor


def alignment(a: Tensor, b: Tensor, *, alpha: float = 2.0) -> float:
    """``E ||f(x) - f(y)||^alpha`` over positive pairs, after L2 normalisation (lower is better).

    Args:
        a: ``(N, D)`` embeddings.
        b: ``(N, D)`` embeddings; ``b[i]`` is the positive of ``a[i]``.
        alpha: The exponent (``> 0``; Wang and Isola use 2).

    Returns:
        A float in ``[0, 2^alpha]``.

    Example:
        >>> a, b = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.0, 1.0], [0.0, 1.0]])
        >>> round(alignment(a, b), 6)  # squared distances 2 and 0
        1.0
    """
    where = "alignment"
    a, b = check_pair(where, a, b, min_rows=1)
    check_positive(where, "alpha", alpha, allow_tensor=False)
    a = F.normalize(a.detach().double(), dim=1)
    b = F.normalize(b.detach().double(), dim=1)
    return float((a - b).norm(dim=1).pow(alpha).mean())


def uniformity(z: Tensor, *, t: float = 2.0, block_size: int = 4096) -> float:
    """``log E_{i != j} exp(-t ||f_i - f_j||^2)`` over distinct pairs, after L2 normalisation
    (lower is more uniform). Computed over blocks of rows, ``O(block_size x N)`` memory.

    Args:
        z: ``(N, D)`` embeddings, ``N >= 2``.
        t: The kernel scale (``> 0``; Wang and Isola use 2).
        block_size: Rows processed at once.

    Returns:
        A float ``<= 0``.

    Example:
        >>> round(uniformity(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])), 4)  # distance 2: -2 * 4
        -8.0
    """
    where = "uniformity"
    z = check_tensor(where, "z", z, ndim=2)
    check_int_range(where, "z.shape[0]", z.shape[0], 2, None)
    check_positive(where, "t", t, allow_tensor=False)
    check_int_range(where, "block_size", block_size, 1, None)
    z = F.normalize(z.detach().double(), dim=1)
    n = z.shape[0]
    parts = []
    for start in range(0, n, block_size):
        stop = min(start + block_size, n)
        # ||u - v||^2 = 2 - 2 u.v for unit vectors; clamp the rounding below 0.
        sq = (2.0 - 2.0 * (z[start:stop] @ z.T)).clamp_min(0.0)  # (Q, N)
        rows = torch.arange(stop - start)
        logits = -t * sq
        logits[rows, rows + start] = float("-inf")  # leave out i == j
        parts.append(torch.logsumexp(logits, dim=1))
    return float(torch.logsumexp(torch.cat(parts), dim=0)) - math.log(n * (n - 1))


__all__ = ["alignment", "uniformity"]
