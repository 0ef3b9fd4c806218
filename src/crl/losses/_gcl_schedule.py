"""GCL's gamma schedule and the check of its settings (docs/theory.md §10)."""

from __future__ import annotations

import math

from crl._validation import check_choice, check_int_range, check_positive
from crl.errors import CrlValueError


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


def check_gamma_schedule(where: str, schedule: str, gamma: float, gamma_min: float,
                         decay_epochs: int | None) -> str:
    """The schedule's settings checked: ``gamma`` and ``gamma_min`` in ``(0, 1]``, ``schedule``
    ``"constant"`` or ``"cosine"`` (which needs ``decay_epochs >= 1``); returns ``schedule``."""
    for name, value in (("gamma", gamma), ("gamma_min", gamma_min)):
        check_positive(where, name, value, allow_tensor=False)
        if value > 1:
            raise CrlValueError(f"{where}: `{name}` must be in (0, 1]; got {value}")
    schedule = check_choice(where, "gamma_schedule", schedule, ("constant", "cosine"))
    if schedule == "cosine":
        if decay_epochs is None:
            raise CrlValueError(f"{where}: `decay_epochs` is required for "
                                "gamma_schedule='cosine'; got None")
        check_int_range(where, "decay_epochs", decay_epochs, 1, None)
    return schedule


__all__ = ["check_gamma_schedule", "cosine_gamma"]
