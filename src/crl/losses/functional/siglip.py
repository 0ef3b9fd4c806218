"""The SigLIP pairwise sigmoid loss (Zhai et al. 2023; docs/theory.md §8), as functions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from crl._validation import check_finite_scalar, check_pair, check_positive, compute_dtype, upcast


def siglip_loss(a: Tensor, b: Tensor, scale: float | Tensor, bias: float | Tensor) -> Tensor:
    """open_clip's ``SigLipLoss`` on one process.

    ``-(1/B) sum_{i,j} log sigmoid( z_ij (scale * a_i . b_j + bias) )`` with ``z_ii = 1`` and
    ``z_ij = -1`` for ``i != j``.

    Args:
        a: ``(B, D)`` embeddings.
        b: ``(B, D)`` embeddings; ``b[i]`` is the positive of ``a[i]``.
        scale: ``t = exp(t') > 0``, a number or 0-dim tensor.
        bias: ``b``, a finite number or 0-dim tensor.

    Returns:
        0-dim tensor.

    Example:
        >>> a = torch.eye(2)
        >>> round(float(siglip_loss(a, a, 1.0, 0.0)), 4)  # 2 * softplus(-1) + 2 * log 2, / 2
        1.0064
    """
    where = "siglip_loss"
    a, b = check_pair(where, a, b)
    check_positive(where, "scale", scale)
    check_finite_scalar(where, "bias", bias)
    dtype = compute_dtype(a, b)
    a, b = upcast(a, dtype), upcast(b, dtype)
    if isinstance(scale, Tensor):
        scale = upcast(scale, dtype)
    if isinstance(bias, Tensor):
        bias = upcast(bias, dtype)
    logits = scale * (a @ b.T) + bias  # (B, B)
    negatives = ~torch.eye(a.shape[0], dtype=torch.bool, device=a.device)
    return siglip_rows(logits, negatives, 0).mean()


def siglip_rows(logits: Tensor, negatives: Tensor, offset: int) -> Tensor:
    """``(h,)``: ``-log sigmoid(L_ii) - sum_{j in neg(i)} log sigmoid(-L_ij)`` of each row of
    ``logits (h, B)``, the positive of row ``i`` at column ``offset + i`` (no checks)."""
    own = torch.arange(logits.shape[0], device=logits.device)
    positive = -F.logsigmoid(logits[own, own + offset])
    return positive - (F.logsigmoid(-logits) * negatives).sum(dim=1)


__all__ = ["siglip_loss", "siglip_rows"]
