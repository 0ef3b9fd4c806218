"""GCL's gamma schedule (docs/theory.md §10)."""

from __future__ import annotations

import math


def cosine_gamma(epoch: int, decay_epochs: int, gamma_min: float) -> float:
    """``gamma_e = 0.5 (1 + cos(pi e / E)) (1 - gamma_min) + gamma_min``, and ``gamma_min`` for
    ``e >= E`` (docs/theory.md §10).

    Example:
        >>> cosine_gamma(0, 10, 0.2), cosine_gamma(5, 10, 0.2), cosine_gamma(12, 10, 0.2)
        (1.0, 0.6000000000000001, 0.2)
    """
    if epoch >= decay_epochs:
        return gamma_min
    return 0.5 * (1.0 + math.cos(math.pi * epoch / decay_epochs)) * (1.0 - gamma_min) + gamma_min


__all__ = ["cosine_gamma"]
