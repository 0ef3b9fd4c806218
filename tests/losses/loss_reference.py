"""Slow, obviously-correct float64 references for the losses of :mod:`crl.losses`.

Every reference is written straight from the formulas of docs/theory.md §8 with explicit Python
loops over anchors and candidates, on float64 torch scalars, so that ``torch.autograd`` on the
reference gives the reference gradient. The only numerical device used is the max-subtracted
log-sum-exp (:func:`ref_logsumexp`), needed to evaluate the formulas at large logits.

The OCE references do not use the closed forms of the library: the inner ``inf_mu`` is solved by an
independent method (all breakpoints for CVaR, scipy's bounded Brent search for the smooth ``phi``).

Import from any test folder with ``from loss_reference import ...`` (``tests/conftest.py`` puts
this folder on ``sys.path``). Inputs may be of any float dtype; they are converted to float64.
Masks are ``(B, B)`` or ``(B, M)`` bool tensors, ``None`` meaning the default of each loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from torch import Tensor

__all__ = [
    "ref_clip_loss",
    "ref_contrastive_risk",
    "ref_info_nce",
    "ref_logsumexp",
    "ref_oce_by_minimisation",
    "ref_oce_cvar",
    "ref_oce_kl",
    "ref_oce_softplus",
    "ref_pairwise_risk",
    "ref_relaxed_kmeans",
    "ref_relaxed_kmeans_grad",
    "ref_siglip_loss",
    "ref_supcon_loss",
    "softplus_phi",
]

ScalarLike = float | Tensor


def _f64(x: Tensor) -> Tensor:
    return x.to(torch.float64)


def _scalar(x: ScalarLike) -> Tensor:
    """A float64 0-dim tensor (keeps the autograd graph of a tensor argument)."""
    if isinstance(x, Tensor):
        return x.to(torch.float64)
    return torch.tensor(float(x), dtype=torch.float64)


def _dot(u: Tensor, v: Tensor) -> Tensor:
    total = u[0] * v[0]
    for d in range(1, u.shape[0]):
        total = total + u[d] * v[d]
    return total


def _sum(values: Sequence[Tensor]) -> Tensor:
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total


def _mean(values: Sequence[Tensor]) -> Tensor:
    return _sum(values) / len(values)


def ref_logsumexp(values: Sequence[Tensor]) -> Tensor:
    """``log sum_k exp(values[k])`` for a list of 0-dim tensors, as ``m + log sum exp(v - m)``."""
    peak = max(float(v.detach()) for v in values)
    return peak + torch.log(_sum([torch.exp(v - peak) for v in values]))


def _softplus(x: Tensor) -> Tensor:
    """``log(1 + e^x)`` without overflow: ``max(x, 0) + log1p(exp(-|x|))``."""
    return torch.clamp(x, min=0.0) + torch.log1p(torch.exp(-torch.abs(x)))


def _negatives(mask: Tensor | None, i: int, batch: int) -> list[int]:
    """The negatives of anchor ``i``: ``j != i`` where ``mask[i, j]`` (every ``j != i`` if None)."""
    return [j for j in range(batch) if j != i and (mask is None or bool(mask[i, j]))]


def _one_way_info_nce(a: Tensor, b: Tensor, tau: Tensor, mask: Tensor | None) -> Tensor:
    batch = a.shape[0]
    losses = []
    for i in range(batch):
        positive = _dot(a[i], b[i]) / tau
        candidates = [positive] + [_dot(a[i], b[j]) / tau for j in _negatives(mask, i, batch)]
        losses.append(ref_logsumexp(candidates) - positive)
    return _mean(losses)


def ref_info_nce(
    a: Tensor,
    b: Tensor,
    temperature: ScalarLike,
    *,
    symmetric: bool = False,
    negatives_mask: Tensor | None = None,
) -> Tensor:
    """InfoNCE with the positive in the denominator, averaged over anchors.

    ``l_i = -log( exp(s_ii/tau) / (exp(s_ii/tau) + sum_{j in neg(i)} exp(s_ij/tau)) )``,
    ``s_ij = a_i . b_j``, ``neg(i) = {j != i : negatives_mask[i, j]}``. With ``symmetric`` the mean
    of this and the same with ``a`` and ``b`` swapped and the mask transposed.

    Args:
        a: ``(B, D)`` anchors.
        b: ``(B, D)`` positives.
        temperature: ``tau``.
        symmetric: Average both directions.
        negatives_mask: ``(B, B)`` bool or None.
    """
    a, b, tau = _f64(a), _f64(b), _scalar(temperature)
    loss = _one_way_info_nce(a, b, tau, negatives_mask)
    if symmetric:
        mask_t = None if negatives_mask is None else negatives_mask.T
        loss = 0.5 * (loss + _one_way_info_nce(b, a, tau, mask_t))
    return loss


def _cross_entropy_on_diagonal(rows: Tensor, cols: Tensor, scale: Tensor) -> Tensor:
    """``mean_i -log softmax_j(scale * rows_i . cols_j)[i]``."""
    batch = rows.shape[0]
    losses = []
    for i in range(batch):
        logits = [scale * _dot(rows[i], cols[j]) for j in range(batch)]
        losses.append(ref_logsumexp(logits) - logits[i])
    return _mean(losses)


def ref_clip_loss(a: Tensor, b: Tensor, scale: ScalarLike) -> Tensor:
    """open_clip's ClipLoss: ``(CE(scale a b^T, arange) + CE(scale b a^T, arange)) / 2``.

    Args:
        a: ``(B, D)`` image embeddings.
        b: ``(B, D)`` text embeddings.
        scale: ``exp(logit_scale)``.
    """
    a, b, s = _f64(a), _f64(b), _scalar(scale)
    return 0.5 * (_cross_entropy_on_diagonal(a, b, s) + _cross_entropy_on_diagonal(b, a, s))


def ref_siglip_loss(a: Tensor, b: Tensor, scale: ScalarLike, bias: ScalarLike) -> Tensor:
    """open_clip's SigLipLoss: ``-(1/B) sum_{i,j} log sigmoid(z_ij (scale a_i.b_j + bias))``.

    ``z_ii = +1``, ``z_ij = -1`` for ``i != j``; ``-log sigmoid(x) = softplus(-x)``.

    Args:
        a: ``(B, D)``.
        b: ``(B, D)``.
        scale: ``t > 0``.
        bias: ``b``.
    """
    a, b, s, c = _f64(a), _f64(b), _scalar(scale), _scalar(bias)
    batch = a.shape[0]
    terms = []
    for i in range(batch):
        for j in range(batch):
            sign = 1.0 if i == j else -1.0
            terms.append(_softplus(-sign * (s * _dot(a[i], b[j]) + c)))
    return _sum(terms) / batch


def ref_supcon_loss(z: Tensor, labels: Tensor, temperature: ScalarLike) -> Tensor:
    """SupCon ``L_out`` (Khosla et al. 2020), ``s = z z^T``.

    For anchor ``i`` with ``P(i) = {p != i : labels[p] == labels[i]}`` non-empty:
    ``mean_{p in P(i)} [ log sum_{a != i} exp(s_ia / tau) - s_ip / tau ]``; anchors with empty
    ``P(i)`` are left out of the mean over anchors.

    Args:
        z: ``(N, D)`` embeddings.
        labels: ``(N,)`` integer labels.
        temperature: ``tau``.
    """
    z, tau = _f64(z), _scalar(temperature)
    n = z.shape[0]
    label_list = [int(v) for v in labels]
    losses = []
    for i in range(n):
        positives = [p for p in range(n) if p != i and label_list[p] == label_list[i]]
        if not positives:
            continue
        denominator = ref_logsumexp([_dot(z[i], z[k]) / tau for k in range(n) if k != i])
        losses.append(_mean([denominator - _dot(z[i], z[p]) / tau for p in positives]))
    if not losses:
        raise ValueError("no anchor has a same-label partner")
    return _mean(losses)


def ref_contrastive_risk(
    a: Tensor, b: Tensor, temperature: ScalarLike, *, negatives_mask: Tensor | None = None
) -> Tensor:
    """Positive-excluded contrastive risk, averaged over anchors.

    ``tau * log( (1/m_i) sum_{j in neg(i)} exp((s_ij - s_ii) / tau) )``, ``m_i = |neg(i)|``.

    Args:
        a: ``(B, D)`` anchors.
        b: ``(B, D)`` positives.
        temperature: ``tau``.
        negatives_mask: ``(B, B)`` bool or None (every ``j != i``); the diagonal is ignored.
    """
    a, b, tau = _f64(a), _f64(b), _scalar(temperature)
    batch = a.shape[0]
    risks = []
    for i in range(batch):
        positive = _dot(a[i], b[i])
        negatives = _negatives(negatives_mask, i, batch)
        deltas = [(_dot(a[i], b[j]) - positive) / tau for j in negatives]
        risks.append(tau * (ref_logsumexp(deltas) - math.log(len(negatives))))
    return _mean(risks)


def _rows(delta: Tensor, mask: Tensor | None) -> list[list[Tensor]]:
    """The valid entries of each row of ``delta`` as float64 0-dim tensors."""
    delta = _f64(delta)
    return [
        [delta[i, j] for j in range(delta.shape[1]) if mask is None or bool(mask[i, j])]
        for i in range(delta.shape[0])
    ]


def ref_oce_kl(delta: Tensor, temperature: float, *, mask: Tensor | None = None) -> Tensor:
    """OCE with ``phi(t) = tau (e^{t/tau} - 1)``, in closed form.

    ``mean_i tau log mean_{j valid} exp(delta_ij / tau)``.

    Args:
        delta: ``(B, M)`` score differences.
        temperature: ``tau``.
        mask: ``(B, M)`` bool of valid entries or None (all valid).
    """
    tau = float(temperature)
    per_row = [
        tau * (ref_logsumexp([d / tau for d in row]) - math.log(len(row)))
        for row in _rows(delta, mask)
    ]
    return _mean(per_row)


def ref_oce_cvar(delta: Tensor, alpha: float, *, mask: Tensor | None = None) -> Tensor:
    """OCE with ``phi(t) = max(t, 0) / alpha`` (CVaR_alpha), by enumerating the breakpoints.

    ``mu + mean_j max(d_j - mu, 0) / alpha`` is convex and piecewise linear in ``mu`` with kinks at
    the data points, so its minimum is attained at one of them: the minimum over ``mu = d_k`` (kept
    as a tensor, so the gradient is that of the active piece) is the exact infimum.

    Args:
        delta: ``(B, M)`` score differences.
        alpha: Tail fraction in ``(0, 1]``.
        mask: ``(B, M)`` bool of valid entries or None.
    """
    per_row = []
    for row in _rows(delta, mask):
        candidates = [
            mu + _mean([torch.clamp(d - mu, min=0.0) for d in row]) / alpha for mu in row
        ]
        per_row.append(torch.stack(candidates).min())
    return _mean(per_row)


def ref_oce_by_minimisation(
    delta: Tensor,
    phi: Callable[[Tensor], Tensor],
    *,
    mask: Tensor | None = None,
) -> Tensor:
    """``mean_i inf_mu { mu + mean_j phi(delta_ij - mu) }`` for a smooth strictly convex ``phi``.

    The infimum over ``mu`` is found by scipy's bounded Brent search on ``[min_j, max_j]`` of the
    row widened by 1 (the minimiser of a valid OCE lies in the row's range), ``xatol=1e-13``.
    The value is then re-evaluated in torch at the fixed minimiser, so autograd gives the gradient
    of the envelope theorem (exact for a smooth ``phi`` with a unique minimiser).

    Args:
        delta: ``(B, M)`` score differences.
        phi: Elementwise ``phi`` on float64 tensors.
        mask: ``(B, M)`` bool of valid entries or None.
    """
    per_row = []
    for row in _rows(delta, mask):
        values = torch.stack(row)
        fixed = values.detach()

        def objective(mu: float, fixed: Tensor = fixed) -> float:
            return float(mu + phi(fixed - mu).mean())

        low, high = float(fixed.min()) - 1.0, float(fixed.max()) + 1.0
        result = minimize_scalar(
            objective, bounds=(low, high), method="bounded", options={"xatol": 1e-13}
        )
        mu = float(result.x)
        per_row.append(mu + phi(values - mu).mean())
    return _mean(per_row)


def softplus_phi(t: Tensor) -> Tensor:
    """The softplus OCE ``phi(t) = 2 log(1 + e^t) - 2 log 2``."""
    return 2.0 * _softplus(t) - 2.0 * math.log(2.0)


def ref_oce_softplus(delta: Tensor, *, mask: Tensor | None = None) -> Tensor:
    """OCE with ``phi(t) = 2 log(1 + e^t) - 2 log 2``, inner infimum by Brent's method.

    Args:
        delta: ``(B, M)`` score differences.
        mask: ``(B, M)`` bool of valid entries or None.
    """
    return ref_oce_by_minimisation(delta, softplus_phi, mask=mask)


_PAIRWISE: dict[str, Callable[[Tensor], Tensor]] = {
    # l(t) with t = s(x, y) - s(x, y') = -delta.
    "logistic": lambda t: _softplus(-t),
    "exponential": lambda t: torch.exp(-t),
    "squared_hinge": lambda t: torch.clamp(1.0 - t, min=0.0) ** 2,
    "hinge": lambda t: torch.clamp(1.0 - t, min=0.0),
}


def ref_pairwise_risk(delta: Tensor, loss: str, *, mask: Tensor | None = None) -> Tensor:
    """``mean_i mean_{j valid} l(-delta_ij)`` for the pairwise surrogate ``l`` named ``loss``.

    Args:
        delta: ``(B, M)`` score differences.
        loss: ``"logistic"``, ``"exponential"``, ``"squared_hinge"`` or ``"hinge"``.
        mask: ``(B, M)`` bool of valid entries or None.
    """
    surrogate = _PAIRWISE[loss]
    return _mean([_mean([surrogate(-d) for d in row]) for row in _rows(delta, mask)])


def ref_relaxed_kmeans(z: Tensor | np.ndarray, k: int) -> float:
    """Sum of all but the ``k`` largest eigenvalues of the ``(B, B)`` Gram ``z z^T`` (numpy).

    Args:
        z: ``(B, D)`` embeddings.
        k: Number of clusters.
    """
    zz = np.asarray(z.detach().to(torch.float64) if isinstance(z, Tensor) else z, np.float64)
    eigenvalues = np.linalg.eigvalsh(zz @ zz.T)  # ascending
    return float(eigenvalues[: max(len(eigenvalues) - k, 0)].sum())


def ref_relaxed_kmeans_grad(z: Tensor | np.ndarray, k: int) -> np.ndarray:
    """Gradient of :func:`ref_relaxed_kmeans` wrt ``z``: ``2 (I - U_k U_k^T) z``.

    ``tr(z z^T)`` has gradient ``2 z`` and the sum of the top ``k`` eigenvalues of ``z z^T`` has
    gradient ``2 U_k U_k^T z`` (``U_k`` its top-``k`` eigenvectors), valid when the ``k``-th and
    ``k+1``-th eigenvalues differ.

    Args:
        z: ``(B, D)`` embeddings.
        k: Number of clusters.
    """
    zz = np.asarray(z.detach().to(torch.float64) if isinstance(z, Tensor) else z, np.float64)
    _, vectors = np.linalg.eigh(zz @ zz.T)
    top = vectors[:, -k:]  # (B, k)
    return np.asarray(2.0 * (zz - top @ (top.T @ zz)))
