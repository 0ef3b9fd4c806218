"""The backtest of a regime's law: the largest n left out, its m* predicted from the smaller
ones, prediction against measurement (docs/negatives.md, "The law"; :mod:`.laws`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from crl.experiments.negatives.curves import CurveCell
from crl.experiments.negatives.laws import LawFit, finite, fit_law


@dataclass(frozen=True)
class Backtest:
    """The largest n predicted from the smaller ones.

    Attributes:
        regime, held_out_n: The cell left out. law: The law fitted without it.
        predicted: ``(m*, low, high)`` from that law (None when not identified).
        measured: ``(m* or None, lower, upper)`` of the held-out cell.
        agrees: The predicted and measured intervals overlap (None without a prediction).
        reason: In words.
    """

    regime: str
    held_out_n: int
    law: LawFit
    predicted: tuple[float, float, float] | None
    measured: tuple[float | None, float, float]
    agrees: bool | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the law fitted without the held-out cell included)."""
        return {"regime": self.regime, "held_out_n": self.held_out_n,
                "law": self.law.to_dict(),
                "predicted": None if self.predicted is None else [finite(v) for v in
                                                                  self.predicted],
                "span": (None if self.predicted is None or self.predicted[1] <= 0 else
                         finite(self.predicted[2] / self.predicted[1])),
                "measured": [finite(v) for v in self.measured], "agrees": self.agrees,
                "reason": self.reason}


def backtest(cells: list[CurveCell], regime: str) -> Backtest | None:
    """Fit ``regime``'s law without its largest n, predict that cell, compare (None with no
    cells)."""
    mine = sorted((c for c in cells if c.regime == regime), key=lambda c: c.n)
    if not mine:
        return None
    held = mine[-1]
    law = fit_law(mine[:-1], regime)
    predicted = law.predict(held.n)
    measured = (held.m_star, held.lower, held.upper)
    if predicted is None:
        return Backtest(regime, held.n, law, None, measured, None,
                        f"no prediction: {law.reason}")
    if predicted[1] <= 0 or math.isinf(predicted[2]):
        return Backtest(regime, held.n, law, predicted, measured, None,
                        f"the prediction from n < {held.n:,} is not bounded (its interval is "
                        f"open: {law.reason})")
    agrees = predicted[1] <= held.upper and held.lower <= predicted[2]
    return Backtest(regime, held.n, law, predicted, measured, agrees,
                    f"predicted {predicted[0]:.4g} [{predicted[1]:.4g}, {predicted[2]:.4g}] "
                    f"from n < {held.n:,} (law {law.verdict}); measured "
                    f"{'-' if held.m_star is None else format(held.m_star, '.4g')} "
                    f"[{held.lower:.4g}, {held.upper:.4g}]: "
                    + ("the intervals overlap" if agrees else "the intervals do not overlap")
                    + f" (the prediction spans a factor {predicted[2] / predicted[1]:.3g})")
