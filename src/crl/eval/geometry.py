"""Alignment and uniformity of normalised embeddings (Wang and Isola, ICML 2020)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from crl._validation import check_int_range, check_pair, check_positive, check_tensor
from crl.losses.tiled import anchor_logsumexp


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
    (lower is more uniform). Computed over ``block_size x block_size`` tiles of ``z @ z.T``
    (:func:`crl.losses.anchor_logsumexp`), ``O(N D + block_size²)`` memory.

    Args:
        z: ``(N, D)`` embeddings, ``N >= 2``.
        t: The kernel scale (``> 0``; Wang and Isola use 2).
        block_size: Tile side.

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
    # -t ||u - v||^2 = 2t u.v - 2t for unit vectors: per row, log sum_{j != i} exp(2t z_i.z_j)
    rows = anchor_logsumexp(z, z, 2.0 * t, include_positive=False, block_size=block_size).lse
    return float(torch.logsumexp(rows, dim=0)) - 2.0 * t - math.log(n * (n - 1))


__all__ = ["alignment", "uniformity"]
