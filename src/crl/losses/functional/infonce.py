"""InfoNCE, the CLIP loss and the positive-excluded contrastive risk (docs/theory.md §8).

All functions take paired embeddings ``a (B, D)`` and ``b (B, D)``, with ``b[i]`` the positive of
``a[i]``, use them as given (no normalisation), and return the mean over anchors as a 0-dim tensor.
Half-precision inputs are computed in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from crl._validation import (
    check_mask,
    check_pair,
    check_positive,
    compute_dtype,
    upcast,
)
from crl.losses._common import info_nce_rows, masked_logsumexp
from crl.losses.tiled import BlockSize, TileMask, decide_tiles, dense_mask, pair_loss


def _prepare(where: str, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    a, b = check_pair(where, a, b)
    return _widen(a, b)


def _widen(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """The plain path's float32 for half-precision pairs."""
    dtype = compute_dtype(a, b)
    return upcast(a, dtype), upcast(b, dtype)


def _negatives(where: str, negatives_mask: Tensor | None, batch: int,
               device: torch.device) -> Tensor:
    """The ``(B, B)`` negatives mask with the diagonal (the positive) removed."""
    eye = torch.eye(batch, dtype=torch.bool, device=device)
    if negatives_mask is None:
        return ~eye
    mask = check_mask(where, "negatives_mask", negatives_mask, (batch, batch),
                      ignore_diagonal=True)
    return mask.to(device) & ~eye


def info_nce(
    a: Tensor,
    b: Tensor,
    *,
    temperature: float | Tensor = 0.07,
    symmetric: bool = False,
    negatives_mask: Tensor | TileMask | None = None,
    index: Tensor | None = None,
    block_size: BlockSize = None,
) -> Tensor:
    """InfoNCE with the positive in the denominator (CPC / SimCLR / CLIP; docs/theory.md §8).

    ``l_i = -log( exp(s_ii/tau) / (exp(s_ii/tau) + sum_{j in neg(i)} exp(s_ij/tau)) )`` with
    ``s = a @ b.T``, averaged over anchors.

    Args:
        a: Anchors, shape ``(B, D)``.
        b: Positives, shape ``(B, D)``; ``b[i]`` is the positive of ``a[i]``.
        temperature: ``tau > 0``, a number or a 0-dim tensor (may require grad).
        symmetric: If True, the mean of the ``a -> b`` and ``b -> a`` directions; the second uses
            the transposed mask.
        negatives_mask: Optional ``(B, B)`` bool, True where ``b[j]`` is a negative of ``a[i]``,
            or a :class:`~crl.losses.tiled.TileMask` (such as
            :class:`~crl.negatives.NegativeSets`) that gives the mask of any block from the
            samples' dataset indices. Default: every ``j != i``. The diagonal is ignored (the
            positive always counts once). Every row needs at least one negative.
        index: ``(B,)`` dataset indices of the pairs, read by a ``TileMask`` mask (default
            ``arange(B)``); unused otherwise.
        block_size: None: the plain ``(B, B)`` computation up to ``B = PLAIN_MAX_BATCH`` (2048),
            the exact tiled one (:mod:`crl.losses.tiled`) above it. ``"plain"``: the plain one at
            any size. An int: always tiled, with ``block_size x block_size`` tiles
            (``O(B·D + block_size²)`` memory). Value and gradients are the same either way.

    Returns:
        0-dim tensor: the mean loss over anchors.

    Raises:
        CrlValueError: on shape mismatch, ``B < 2``, NaN/Inf inputs, ``tau <= 0``, a mask row
            with no negatives or ``block_size < 1``.

    Example:
        >>> a = torch.eye(3)
        >>> round(float(info_nce(a, a, temperature=1.0)), 4)  # log(e + 2) - 1
        0.5514
    """
    where = "info_nce"
    a, b = check_pair(where, a, b)
    tile = decide_tiles(where, block_size, a.shape[0], a.shape[0])
    if tile != "plain":
        return pair_loss(where, a, b, temperature=temperature, symmetric=symmetric,
                         negatives_mask=negatives_mask, index=index, tile=tile)
    a, b = _widen(a, b)
    check_positive(where, "temperature", temperature)
    negatives_mask = dense_mask(where, negatives_mask, index, a.shape[0], a.device)
    negatives = _negatives(where, negatives_mask, a.shape[0], a.device)
    logits = (a @ b.T) / temperature  # (B, B)
    eye = torch.eye(a.shape[0], dtype=torch.bool, device=a.device)
    loss = info_nce_rows(logits, negatives | eye).mean()
    if symmetric:
        loss = 0.5 * (loss + info_nce_rows(logits.T, negatives.T | eye).mean())
    return loss


def clip_loss(a: Tensor, b: Tensor, scale: float | Tensor, *,
              block_size: BlockSize = None) -> Tensor:
    """The CLIP loss exactly as open_clip's ``ClipLoss`` on one process.

    ``(CE(scale * a @ b.T, arange(B)) + CE(scale * b @ a.T, arange(B))) / 2``, where ``scale`` is
    ``exp(logit_scale) = 1 / tau``.

    Args:
        a: Image (or view-a) embeddings ``(B, D)``.
        b: Text (or view-b) embeddings ``(B, D)``.
        scale: Positive number or 0-dim tensor (may require grad).
        block_size: None: plain up to ``B = PLAIN_MAX_BATCH`` (2048), exact tiles
            (:mod:`crl.losses.tiled`) above; ``"plain"``: plain at any size; an int: always
            tiled with that tile side. Same value and gradients either way.

    Returns:
        0-dim tensor.

    Example:
        >>> a = torch.eye(3)
        >>> round(float(clip_loss(a, a, 1.0)), 4)
        0.5514
    """
    where = "clip_loss"
    a, b = check_pair(where, a, b)
    tile = decide_tiles(where, block_size, a.shape[0], a.shape[0])
    if tile != "plain":
        return pair_loss(where, a, b, scale=scale, symmetric=True, tile=tile)
    a, b = _widen(a, b)
    check_positive(where, "scale", scale)
    if isinstance(scale, Tensor):
        scale = upcast(scale, a.dtype)
    logits = scale * (a @ b.T)  # (B, B)
    target = torch.arange(a.shape[0], device=a.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


def contrastive_risk(
    a: Tensor,
    b: Tensor,
    *,
    temperature: float | Tensor,
    negatives_mask: Tensor | None = None,
) -> Tensor:
    """The positive-excluded empirical contrastive risk (docs/theory.md §8).

    Per anchor ``tau * log( (1/m_i) sum_{j in neg(i)} exp((s_ij - s_ii) / tau) )`` with
    ``s = a @ b.T`` and ``m_i = |neg(i)|``, averaged over anchors. It equals
    ``tau * (InfoNCE without the positive in the denominator - log m)``.

    Args:
        a: Anchors ``(B, D)``.
        b: Positives ``(B, D)``.
        temperature: ``tau > 0``.
        negatives_mask: Optional ``(B, B)`` bool of negatives (default every ``j != i``; the
            diagonal is ignored).

    Returns:
        0-dim tensor.

    Example:
        >>> a = torch.eye(3)
        >>> round(float(contrastive_risk(a, a, temperature=1.0)), 4)  # all deltas are -1
        -1.0
    """
    where = "contrastive_risk"
    a, b = _prepare(where, a, b)
    check_positive(where, "temperature", temperature)
    negatives = _negatives(where, negatives_mask, a.shape[0], a.device)
    scores = a @ b.T  # (B, B)
    delta = (scores - scores.diagonal().unsqueeze(1)) / temperature
    count = negatives.sum(dim=1).to(delta.dtype)
    per_anchor = masked_logsumexp(delta, negatives, dim=1) - torch.log(count)
    return (temperature * per_anchor).mean()


__all__ = ["clip_loss", "contrastive_risk", "info_nce"]
