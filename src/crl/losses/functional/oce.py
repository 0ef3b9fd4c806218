"""Optimized-certainty-equivalent (OCE) risks and pairwise AUC surrogates (docs/theory.md §8).

Both take ``delta (B, M)`` with ``delta[i, j] = s(x_i, y'_ij) - s(x_i, y_i)``: how much negative j
out-scores the positive of anchor i. An optional ``mask (B, M)`` selects the valid entries (every
row needs one). Both return the mean over anchors of a per-row quantity.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from crl._validation import (
    check_choice,
    check_mask,
    check_positive,
    check_tensor,
    compute_dtype,
    upcast,
)
from crl.errors import CrlValueError
from crl.losses._common import masked_logsumexp

OCE_PHIS = ("kl", "cvar", "softplus")
PAIRWISE_LOSSES = ("logistic", "exponential", "squared_hinge", "hinge")

_LOG2 = math.log(2.0)


def _prepare(where: str, delta: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    delta = check_tensor(where, "delta", delta, ndim=2)
    if delta.shape[1] < 1 or delta.shape[0] < 1:
        raise CrlValueError(
            f"{where}: `delta` must be (B, M) with B, M >= 1; got {tuple(delta.shape)}"
        )
    if mask is None:
        mask = torch.ones_like(delta, dtype=torch.bool)
    else:
        mask = check_mask(where, "mask", mask, tuple(delta.shape)).to(delta.device)
    return upcast(delta, compute_dtype(delta)), mask


def _cvar(delta: Tensor, mask: Tensor, alpha: float) -> Tensor:
    """Exact per-row CVaR_alpha (mean of the top alpha fraction) of the masked empirical law."""
    count = mask.sum(dim=1, keepdim=True).to(delta.dtype)  # (B, 1)
    low = torch.finfo(delta.dtype).min
    ordered, _ = torch.sort(delta.masked_fill(~mask, low), dim=1, descending=True)  # (B, M)
    rank = torch.arange(delta.shape[1], device=delta.device, dtype=delta.dtype).unsqueeze(0)
    # Probability mass each sorted value contributes to the upper alpha tail.
    weight = torch.clamp(alpha - rank / count, min=0.0)
    weight = torch.minimum(weight, 1.0 / count)
    ordered = torch.where(weight > 0, ordered, torch.zeros_like(ordered))
    return (weight * ordered).sum(dim=1) / alpha


def _softplus_phi(t: Tensor) -> Tensor:
    return 2.0 * F.softplus(t) - 2.0 * _LOG2


def _softplus_argmin(delta: Tensor, mask: Tensor, iterations: int = 200) -> Tensor:
    """The exact minimiser ``mu`` of ``mu + mean phi(delta - mu)`` for the softplus phi.

    The optimality condition is ``mean sigmoid(delta - mu) = 1/2``, whose left side decreases in
    ``mu``; the root lies between the row's min and max, so bisection converges to machine
    precision.
    """
    with torch.no_grad():
        big = torch.finfo(delta.dtype).max
        lo = delta.masked_fill(~mask, big).amin(dim=1)
        hi = delta.masked_fill(~mask, -big).amax(dim=1)
        count = mask.sum(dim=1).to(delta.dtype)
        for _ in range(iterations):
            mid = 0.5 * (lo + hi)
            mean_sig = (torch.sigmoid(delta - mid.unsqueeze(1)) * mask).sum(dim=1) / count
            above = mean_sig > 0.5  # root is above mid
            lo = torch.where(above, mid, lo)
            hi = torch.where(above, hi, mid)
            if bool(((hi - lo) <= 4 * torch.finfo(delta.dtype).eps * (1 + hi.abs())).all()):
                break
        return 0.5 * (lo + hi)


def oce_risk(
    delta: Tensor,
    *,
    phi: Literal["kl", "cvar", "softplus"] = "kl",
    temperature: float | None = None,
    alpha: float | None = None,
    mask: Tensor | None = None,
) -> Tensor:
    """Mean over anchors of ``OCE_phi(row) = inf_mu { mu + mean_j phi(delta_ij - mu) }``.

    The inner minimum is solved exactly for each row:

    - ``"kl"``: ``phi(t) = tau (exp(t/tau) - 1)``, closed form ``tau * log mean exp(delta/tau)``
      (this is the contrastive risk); needs ``temperature``.
    - ``"cvar"``: ``phi(t) = max(t, 0) / alpha``, the mean of the top ``alpha`` fraction of the
      row (exact on the empirical law, by sorting); needs ``alpha`` in ``(0, 1]``.
    - ``"softplus"``: ``phi(t) = 2 log(1 + e^t) - 2 log 2``, minimiser by bisection to machine
      precision; the gradient follows from the envelope theorem (``mu`` is held fixed).

    Args:
        delta: ``(B, M)`` score differences ``s(x_i, y'_ij) - s(x_i, y_i)``.
        phi: One of ``"kl"``, ``"cvar"``, ``"softplus"``.
        temperature: ``tau > 0`` for ``"kl"``.
        alpha: Tail fraction in ``(0, 1]`` for ``"cvar"``.
        mask: Optional ``(B, M)`` bool of valid entries.

    Returns:
        0-dim tensor.

    Example:
        >>> d = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
        >>> float(oce_risk(d, phi="cvar", alpha=0.5))
        2.5
    """
    where = "oce_risk"
    check_choice(where, "phi", phi, OCE_PHIS)
    delta, mask = _prepare(where, delta, mask)
    if phi == "kl":
        if temperature is None:
            raise CrlValueError(f"{where}: phi='kl' needs `temperature` (tau > 0); got None")
        check_positive(where, "temperature", temperature)
    elif phi == "cvar":
        if alpha is None:
            raise CrlValueError(f"{where}: phi='cvar' needs `alpha` in (0, 1]; got None")
        check_positive(where, "alpha", alpha, allow_tensor=False)
        if alpha > 1:
            raise CrlValueError(
                f"{where}: `alpha` must be in (0, 1] (phi'(0) must contain 1); got {alpha}"
            )
    return oce_rows(delta, mask, phi=phi, temperature=temperature, alpha=alpha).mean()


def oce_rows(delta: Tensor, mask: Tensor, *, phi: str, temperature: float | Tensor | None,
             alpha: float | None) -> Tensor:
    """``(B,)``: :func:`oce_risk` of each row before the mean over anchors (no checks)."""
    if phi == "kl":
        assert temperature is not None
        count = mask.sum(dim=1).to(delta.dtype)
        return temperature * (masked_logsumexp(delta / temperature, mask, dim=1)
                              - torch.log(count))
    if phi == "cvar":
        assert alpha is not None
        return _cvar(delta, mask, float(alpha))
    mu = _softplus_argmin(delta, mask)  # (B,), no grad: envelope theorem
    count = mask.sum(dim=1).to(delta.dtype)
    inner = (_softplus_phi(delta - mu.unsqueeze(1)) * mask).sum(dim=1) / count
    return mu + inner


def pairwise_risk(
    delta: Tensor,
    *,
    loss: Literal["logistic", "exponential", "squared_hinge", "hinge"] = "logistic",
    mask: Tensor | None = None,
) -> Tensor:
    """Mean over anchors of the row mean of ``l(-delta)``, a pairwise AUC surrogate.

    With ``t = s(x, y) - s(x, y') = -delta``: logistic ``log(1 + e^-t)``, exponential ``e^-t``,
    squared hinge ``max(0, 1 - t)^2``, hinge ``max(0, 1 - t)``. The first three are
    AUC-consistent; hinge is not (docs/theory.md §8).

    Args:
        delta: ``(B, M)`` score differences.
        loss: The surrogate ``l``.
        mask: Optional ``(B, M)`` bool of valid entries.

    Returns:
        0-dim tensor.

    Example:
        >>> float(pairwise_risk(torch.tensor([[0.0, -2.0]]), loss="hinge"))
        0.5
    """
    where = "pairwise_risk"
    check_choice(where, "loss", loss, PAIRWISE_LOSSES)
    delta, mask = _prepare(where, delta, mask)
    return pairwise_rows(delta, mask, loss=loss).mean()


def pairwise_rows(delta: Tensor, mask: Tensor, *, loss: str) -> Tensor:
    """``(B,)``: :func:`pairwise_risk` of each row before the mean over anchors (no checks)."""
    if loss == "logistic":
        values = F.softplus(delta)
    elif loss == "exponential":
        values = torch.exp(delta)
    elif loss == "squared_hinge":
        values = torch.clamp(1.0 + delta, min=0.0) ** 2
    else:
        values = torch.clamp(1.0 + delta, min=0.0)
    count = mask.sum(dim=1).to(delta.dtype)
    return (values * mask).sum(dim=1) / count


__all__ = ["OCE_PHIS", "PAIRWISE_LOSSES", "oce_risk", "oce_rows", "pairwise_risk", "pairwise_rows"]
