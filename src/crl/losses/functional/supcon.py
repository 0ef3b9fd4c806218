"""Supervised contrastive loss (Khosla et al. 2020, the "L_out" form; docs/theory.md §8), as
functions."""

from __future__ import annotations

import torch
from torch import Tensor

from crl._validation import check_positive, check_tensor, compute_dtype, describe, upcast
from crl.errors import CrlTypeError, CrlValueError
from crl.losses._common import masked_logsumexp
from crl.losses.base import AnchorTerms, reduce_terms


def supcon_loss(z: Tensor, labels: Tensor, *, temperature: float | Tensor = 0.1) -> Tensor:
    """SupCon, ``L_out``: for anchor i with same-label set ``P(i)`` (``p != i``), the mean over
    ``p in P(i)`` of ``-log( exp(s_ip/tau) / sum_{a != i} exp(s_ia/tau) )``, ``s = z @ z.T``.

    Anchors with no other sample of their label are left out of the mean.

    Args:
        z: ``(N, D)`` embeddings (all views stacked).
        labels: ``(N,)`` integer labels.
        temperature: ``tau > 0``.

    Returns:
        0-dim tensor.

    Raises:
        CrlValueError: if no anchor has a same-label partner, or on bad shapes/values.

    Example:
        >>> z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
        >>> round(float(supcon_loss(z, torch.tensor([0, 0, 1, 1]), temperature=1.0)), 4)
        0.5514
    """
    where = "supcon_loss"
    z = check_tensor(where, "z", z, ndim=2)
    if not isinstance(labels, Tensor):
        raise CrlTypeError(f"{where}: `labels` must be a torch.Tensor; got {describe(labels)}")
    if labels.dim() != 1 or labels.shape[0] != z.shape[0]:
        raise CrlValueError(
            f"{where}: `labels` must have shape ({z.shape[0]},) to match `z`; "
            f"got {tuple(labels.shape)}"
        )
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise CrlTypeError(f"{where}: `labels` must be integers; got dtype {labels.dtype}")
    if z.shape[0] < 2:
        raise CrlValueError(f"{where}: need at least 2 samples; got N = {z.shape[0]}")
    check_positive(where, "temperature", temperature)
    z = upcast(z, compute_dtype(z))
    labels = labels.to(z.device)

    terms = supcon_terms(z, labels, torch.arange(z.shape[0], device=z.device), temperature)
    assert terms.counted is not None
    if not bool(terms.counted.any()):
        raise CrlValueError(
            f"{where}: no anchor has another sample with its label, so the loss is undefined; "
            "give at least two samples of some class (e.g. two views per image)"
        )
    return reduce_terms(terms, world=1)


def supcon_terms(z: Tensor, groups: Tensor, anchors: Tensor, temperature: float | Tensor
                 ) -> AnchorTerms:
    """SupCon ``L_out`` terms of the anchors ``z[anchors]`` against all of ``z (N, D)``; the
    positives of anchor ``a`` are the other rows with its group. Anchors without a positive do
    not count. No checks."""
    logits = (z[anchors] @ z.T) / temperature  # (A, N)
    own = torch.arange(anchors.shape[0], device=z.device)
    others = torch.ones_like(logits, dtype=torch.bool)
    others[own, anchors] = False
    log_denominator = masked_logsumexp(logits, others, dim=1)  # (A,)
    positives = (groups[anchors].unsqueeze(1) == groups.unsqueeze(0)) & others  # (A, N)
    num_pos = positives.sum(dim=1)
    log_prob = logits - log_denominator.unsqueeze(1)  # (A, N)
    values = -(log_prob * positives).sum(dim=1) / num_pos.clamp(min=1).to(z.dtype)
    return AnchorTerms((values,), num_pos > 0)


__all__ = ["supcon_loss", "supcon_terms"]
