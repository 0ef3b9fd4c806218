"""Supervised contrastive loss (Khosla et al. 2020, the "L_out" form; THEORY.md section 1)."""

from __future__ import annotations

import torch
from torch import Tensor

from crl._validation import check_positive, check_tensor, compute_dtype, describe, upcast
from crl.errors import CrlTypeError, CrlValueError
from crl.losses._common import masked_logsumexp


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

    n = z.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=z.device)
    logits = (z @ z.T) / temperature  # (N, N)
    others = ~eye
    log_denominator = masked_logsumexp(logits, others, dim=1)  # (N,)
    positives = (labels.unsqueeze(0) == labels.unsqueeze(1)) & others  # (N, N)
    num_pos = positives.sum(dim=1)
    has_pos = num_pos > 0
    if not bool(has_pos.any()):
        raise CrlValueError(
            f"{where}: no anchor has another sample with its label, so the loss is undefined; "
            "give at least two samples of some class (e.g. two views per image)"
        )
    log_prob = logits - log_denominator.unsqueeze(1)  # (N, N)
    pos_sum = (log_prob * positives).sum(dim=1)
    per_anchor = -pos_sum[has_pos] / num_pos[has_pos].to(z.dtype)
    return per_anchor.mean()
