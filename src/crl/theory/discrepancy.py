"""Internal discrepancy, the mean-classifier loss and class collisions (docs/theory.md §6).

This section of the theory is our reconstruction (docs/theory.md §6): class centre
``mu_c = E_{x~D_c} f(x)``, positive mean ``mu+(x) = E_{x+~A(.|x)} f(x+)`` and internal discrepancy
``ID(f) = E_c E_{x~D_c} ||mu+(x) - mu_c||``. On a finite labelled sample the expectations over
``D_c`` are class means of the sample and ``mu+(x)`` is the mean of ``num_augment`` augmentations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from crl._validation import check_int_range, describe
from crl.errors import CrlTypeError, CrlValueError
from crl.theory.models import _probabilities

Encoder = Callable[[Tensor], Tensor]
Augment = Callable[[Tensor, torch.Generator | None], Tensor]


@dataclass(frozen=True)
class DiscrepancyReport:
    """What :func:`internal_discrepancy` measures.

    Attributes:
        overall: ``ID(f)``, the mean of ``||mu+(x) - mu_c(x)||`` over the sample (classes weighted
            by their empirical frequency).
        per_class: ``(C,)``, the mean within each class, in the order of ``classes``.
        supervised_loss: The mean-classifier loss ``E l({f(x).(mu_c - mu_c')}_{c' != c})``, ``l``
            the softmax cross-entropy (docs/theory.md §6).
        centres: ``(C, D)`` class centres ``mu_c``.
        classes: ``(C,)`` the distinct labels, sorted.
        class_frequencies: ``(C,)`` the empirical class prior.
    """

    overall: float
    per_class: Tensor
    supervised_loss: float
    centres: Tensor
    classes: Tensor
    class_frequencies: Tensor


def internal_discrepancy(encoder: Encoder, data: Tensor, augment: Augment, labels: Tensor, *,
                         num_augment: int = 16, generator: torch.Generator | None = None,
                         batch_size: int = 4096) -> DiscrepancyReport:
    """Internal discrepancy ``ID(f)`` overall and per class, and the mean-classifier loss.

    Args:
        encoder: ``f``, a callable ``(N, ...) -> (N, D)``; called under ``torch.no_grad``.
        data: ``(N, ...)`` inputs.
        augment: ``augment(x, generator) -> x+``, one positive per row of ``x``.
        labels: ``(N,)`` integer class labels; every class needs at least one sample.
        num_augment: Augmentations averaged into each ``mu+(x)``.
        generator: Random generator passed to ``augment``.
        batch_size: Rows encoded at a time.

    Returns:
        A :class:`DiscrepancyReport`.

    Example:
        >>> x = torch.tensor([[0.0], [2.0], [10.0], [12.0]])
        >>> rep = internal_discrepancy(lambda z: z, x, lambda z, g: z, torch.tensor([0, 0, 1, 1]),
        ...                            num_augment=1)
        >>> rep.overall, rep.per_class.tolist()  # positives = the point itself: |x - mu_c| = 1
        (1.0, [1.0, 1.0])
    """
    where = "internal_discrepancy"
    if not callable(encoder) or not callable(augment):
        raise CrlTypeError(f"{where}: `encoder` and `augment` must be callables; got "
                           f"{describe(encoder)} and {describe(augment)}")
    if not isinstance(data, Tensor) or data.dim() < 1 or data.shape[0] < 1:
        raise CrlTypeError(f"{where}: `data` must be a tensor (N, ...) with N >= 1; got "
                           f"{describe(data)}")
    if not isinstance(labels, Tensor) or labels.shape != (data.shape[0],) \
            or labels.is_floating_point():
        raise CrlValueError(f"{where}: `labels` must be an integer tensor of shape "
                            f"({data.shape[0]},); got {describe(labels)}")
    check_int_range(where, "num_augment", num_augment, 1, None)
    check_int_range(where, "batch_size", batch_size, 1, None)
    classes, index = torch.unique(labels, sorted=True, return_inverse=True)
    num_classes = classes.shape[0]

    def encode(x: Tensor) -> Tensor:
        with torch.no_grad():
            parts = [encoder(x[i:i + batch_size]) for i in range(0, x.shape[0], batch_size)]
        out = torch.cat(parts).to(torch.float64)
        if out.dim() != 2 or out.shape[0] != x.shape[0]:
            raise CrlValueError(f"{where}: `encoder` must map (N, ...) to (N, D); got "
                                f"{tuple(out.shape)} for N = {x.shape[0]}")
        return out

    features = encode(data)  # (N, D)
    positive_mean = torch.zeros_like(features)
    for _ in range(num_augment):
        positive_mean += encode(augment(data, generator))
    positive_mean /= num_augment  # mu+(x), (N, D)
    counts = torch.bincount(index, minlength=num_classes).to(torch.float64)  # (C,)
    centres = torch.zeros(num_classes, features.shape[1], dtype=torch.float64)
    centres.index_add_(0, index, features)
    centres /= counts.unsqueeze(1)  # mu_c, (C, D)
    gaps = (positive_mean - centres[index]).norm(dim=1)  # (N,)
    per_class = torch.zeros(num_classes, dtype=torch.float64).index_add_(0, index, gaps) / counts
    # l({f.(mu_c - mu_c')}) = log(1 + sum_{c'!=c} exp(-f.(mu_c - mu_c'))) = CE(f @ mu.T, c).
    supervised = F.cross_entropy(features @ centres.T, index) if num_classes > 1 else \
        torch.zeros((), dtype=torch.float64)
    return DiscrepancyReport(
        overall=float(gaps.mean()), per_class=per_class, supervised_loss=float(supervised),
        centres=centres, classes=classes, class_frequencies=counts / counts.sum(),
    )


def collision_probability(class_probs: Any, k: int) -> float:
    """``tau_k = 1 - sum_c pi_c (1 - pi_c)^k``: the chance that some of ``k`` negatives drawn
    from the prior share the anchor's class (docs/theory.md §6).

    Args:
        class_probs: ``(C,)`` class prior ``pi``.
        k: Number of negatives, ``>= 0``.

    Example:
        >>> collision_probability([0.5, 0.5], 1)
        0.5
        >>> collision_probability([0.9, 0.1], 1) > collision_probability([0.5, 0.5], 1)
        True
    """
    pi = _probabilities("collision_probability", "class_probs", class_probs, 1)
    check_int_range("collision_probability", "k", k, 0, None)
    return float(1.0 - np.sum(pi * (1.0 - pi) ** k))
