"""The held-out contrastive risk, computed over tiles of the score matrix."""

from __future__ import annotations

import math

from torch import Tensor

from crl._validation import check_int_range, check_pair, check_positive
from crl.losses.tiled import anchor_logsumexp


def heldout_contrastive_risk(a: Tensor, b: Tensor, *, temperature: float,
                             block_size: int = 4096) -> float:
    """The positive-excluded contrastive risk with every other item as a negative.

    ``(1/N) sum_i tau log( (1/(N-1)) sum_{j != i} exp((s_ij - s_ii) / tau) )`` with
    ``s = a @ b.T``, in float64, over ``block_size x block_size`` tiles of ``s``
    (:func:`crl.losses.anchor_logsumexp`; memory ``O(N D + block_size²)``). Equals
    :func:`crl.losses.contrastive_risk` on the whole set.

    Args:
        a: ``(N, D)`` anchors.
        b: ``(N, D)`` positives.
        temperature: ``tau > 0``.
        block_size: Tile side.

    Returns:
        A float.

    Example:
        >>> import torch
        >>> round(heldout_contrastive_risk(torch.eye(3), torch.eye(3), temperature=1.0), 6)
        -1.0
    """
    where = "heldout_contrastive_risk"
    a, b = check_pair(where, a, b)
    check_positive(where, "temperature", temperature, allow_tensor=False)
    check_int_range(where, "block_size", block_size, 1, None)
    a, b = a.detach().double(), b.detach().double()
    n = a.shape[0]
    # log sum_{j != i} exp(s_ij / tau) - s_ii / tau = log sum_{j != i} exp((s_ij - s_ii) / tau)
    out = anchor_logsumexp(a, b, 1.0 / temperature, include_positive=False,
                           block_size=block_size, check=False)  # checked above
    return float((temperature * (out.lse - out.positive - math.log(n - 1))).sum()) / n


__all__ = ["heldout_contrastive_risk"]
