"""Disjoint latent classes: a finite model whose ``L*`` and ``E*`` have closed forms
(docs/theory.md §2)."""

from __future__ import annotations

from typing import Any

import numpy as np

from crl._validation import check_int_range, check_positive
from crl.errors import CrlValueError
from crl.theory.models import TabularModel, _probabilities


class LatentClassModel(TabularModel):
    """Disjoint latent classes (docs/theory.md §2): ``p+_x = D_c(x)``, ``p- = sum_c pi_c D_c``.

    Items ``0 .. C*k - 1``; item ``i`` belongs to class ``i // k``. ``D_c`` is uniform on the
    class's ``k`` items unless ``within_class`` ``(C, k)`` gives it; anchors follow
    ``p(x) = pi_c(x) D_c(x)(x)``, so ``p-`` is also the anchor marginal.

    Args:
        class_probs: ``(C,)`` class prior ``pi``.
        items_per_class: ``k >= 1``.
        within_class: Optional ``(C, k)`` rows of ``D_c`` (each sums to 1).

    Example:
        >>> model = LatentClassModel([0.5, 0.25, 0.25], items_per_class=2)
        >>> round(model.optimal_auc(), 6)  # 1 - (0.25 + 0.0625 * 2) / 2
        0.8125
    """

    def __init__(self, class_probs: Any, items_per_class: int = 2,
                 within_class: Any = None) -> None:
        where = "LatentClassModel"
        self.class_probs = _probabilities(where, "class_probs", class_probs, 1)
        if np.any(self.class_probs <= 0):
            raise CrlValueError(f"{where}: every class probability must be > 0; got "
                                f"{self.class_probs.tolist()!r:.80}")
        k = check_int_range(where, "items_per_class", items_per_class, 1, None)
        c = self.class_probs.shape[0]
        if within_class is None:
            within = np.full((c, k), 1.0 / k)
        else:
            within = _probabilities(where, "within_class", within_class, 2)
            if within.shape != (c, k):
                raise CrlValueError(f"{where}: `within_class` must have shape ({c}, {k}); got "
                                    f"{within.shape}")
        self.items_per_class = k
        self.item_class = np.repeat(np.arange(c), k)
        d = np.zeros((c, c * k))
        for cls in range(c):
            d[cls, cls * k:(cls + 1) * k] = within[cls]
        p_x = (self.class_probs[:, None] * d).sum(axis=0)
        super().__init__(p_x, d[self.item_class], p_x)

    def optimal_risk(self, tau: float) -> float:
        """``L* = -tau H(pi)`` in closed form."""
        check_positive("LatentClassModel.optimal_risk", "tau", tau, allow_tensor=False)
        pi = self.class_probs
        return float(tau * np.sum(pi * np.log(pi)))

    def optimal_auc(self) -> float:
        """``E* = 1 - sum_c pi_c^2 / 2`` in closed form."""
        return float(1.0 - 0.5 * np.sum(self.class_probs**2))


__all__ = ["LatentClassModel"]
