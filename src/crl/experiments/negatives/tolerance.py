"""The tolerance of m*: how close to the plateau counts as "the gains have stopped".

m* is the smallest m where the fitted curve comes within the tolerance of its plateau
(:mod:`crl.experiments.negatives.curves`, docs/negatives.md). The tolerance is the user's
choice, in one of two units:

- absolute: points of the metric (``--tolerance 0.01`` is one point of recall@1);
- relative: a percentage of the best value (``--tolerance 2%`` is 2% of the plateau).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from crl.errors import CrlValueError


@dataclass(frozen=True)
class Tolerance:
    """An absolute (metric units) or relative (fraction of the best) tolerance.

    Attributes:
        value: The amount: metric units when absolute, a fraction (0.02 = 2%) when relative.
        relative: Whether ``value`` is a fraction of the best value.

    Example:
        >>> Tolerance.parse("2%").points(0.5), Tolerance.parse("0.01").points(0.5)
        (0.01, 0.01)
        >>> str(Tolerance.parse("2%")), str(Tolerance(0.01))
        ('2% of the best', '0.01')
    """

    value: float
    relative: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)) \
                or not math.isfinite(self.value) or self.value < 0:
            raise CrlValueError(f"--tolerance must be a finite number >= 0 (points of the "
                                f"metric) or a percentage such as '2%'; got {self.value!r}")
        if self.relative and self.value >= 1:
            raise CrlValueError(f"--tolerance as a percentage must be below 100%; got "
                                f"{100 * self.value:g}%")

    @classmethod
    def parse(cls, text: str | float) -> Tolerance:
        """``"0.01"`` -> absolute 0.01; ``"2%"`` -> relative 0.02; a float -> absolute.

        Raises:
            CrlValueError: naming ``--tolerance``, for anything else.
        """
        if isinstance(text, (int, float)) and not isinstance(text, bool):
            return cls(float(text))
        raw = str(text).strip()
        relative = raw.endswith("%")
        number = raw[:-1].strip() if relative else raw
        try:
            value = float(number)
        except ValueError:
            raise CrlValueError(f"--tolerance must be a number of points (e.g. 0.01) or a "
                                f"percentage of the best (e.g. 2%); got {text!r}") from None
        return cls(value / 100 if relative else value, relative)

    def points(self, best: float) -> float:
        """The tolerance in metric units given the best (plateau) value ``best``."""
        return self.value * abs(best) if self.relative else self.value

    def scaled(self, factor: float) -> Tolerance:
        """The same kind of tolerance, ``factor`` times as large (the sensitivity table)."""
        return Tolerance(self.value * factor, self.relative)

    def __str__(self) -> str:
        return f"{100 * self.value:g}% of the best" if self.relative else f"{self.value:g}"


def tolerance_option(value: Any) -> float | str:
    """A study option's ``tolerance`` as ``study.json`` records it: a number of points stays a
    float, a percentage its text (``2%``); a pydantic ``field_validator`` (mode ``before``)
    calls it.

    Raises:
        ValueError: for anything :meth:`Tolerance.parse` refuses, or a value that is not a
            number or a string.

    Example:
        >>> tolerance_option(0.01), tolerance_option(" 2% ")
        (0.01, '2%')
    """
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise CrlValueError("not a number or a percentage")
        parsed = Tolerance.parse(value)
    except CrlValueError:
        raise ValueError("must be a number of points of the metric >= 0 (e.g. 0.01) or a "
                         "percentage of the best below 100% (e.g. 2%)") from None
    return str(value).strip() if parsed.relative else parsed.value
