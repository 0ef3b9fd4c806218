"""The theory's prediction per regime, confronted with the fitted laws (docs/theory.md §7,
"The per-regime prediction").

Balancing the inner error against the outer error ``1/sqrt(n)`` (docs/theory.md §5) gives
``m* ~ n^(1/2)`` for independent sets (inner error ~ 1/m) and ``m* ~ n`` for a shared set
(~ 1/sqrt(m)): alpha 1/2 and 1, and the shared exponent larger by 1/2.

A 95% interval is judged against a prediction:

- **cannot tell** when there is no interval, when the law does not fit or is untested (there
  is no single alpha to compare), when the interval is wider than :data:`NARROW` (twice the
  gap between the two regimes' predictions), or when it holds both regimes' predictions (for
  the difference: both 0.5 and 0), so the data cannot separate them;
- otherwise **consistent** when the interval holds the prediction, **contradicted** when it
  excludes it.

The interval of the difference of the two (independent) fits combines their intervals by the
MOVER method (Zou and Donner, "Construction of confidence limits about effect measures",
Statistics in Medicine 2008): ``L = d - sqrt((a_s - l_s)^2 + (u_i - a_i)^2)``, ``U = d +
sqrt((u_s - a_s)^2 + (a_i - l_i)^2)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from crl.experiments.negatives.laws import LawFit, finite

#: alpha predicted per regime (docs/theory.md §7).
PREDICTED_ALPHA = {"independent": 0.5, "shared": 1.0}
#: An interval wider than this cannot tell (twice the gap between the predictions).
NARROW = 1.0
_LAWS = {"independent": "m* ~ n^(1/2), from a 1/m inner error",
         "shared": "m* ~ n, from a 1/sqrt(m) inner error"}
_NAMES = {"independent": "Independent sets", "shared": "Shared sets"}


@dataclass(frozen=True)
class Verdict:
    """One confrontation of the data with the theory.

    Attributes:
        subject: ``shared``, ``independent`` or ``shared - independent``.
        predicted: The predicted value. estimate, interval: The measured value and its 95%
            interval (None when not identified).
        verdict: ``consistent``, ``contradicted`` or ``cannot tell``. sentence: In words.
    """

    subject: str
    predicted: float
    estimate: float | None
    interval: tuple[float, float] | None
    verdict: str
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (open interval ends are None)."""
        return {"subject": self.subject, "predicted": self.predicted,
                "estimate": self.estimate,
                "interval": None if self.interval is None else [finite(v) for v in
                                                                self.interval],
                "verdict": self.verdict, "sentence": self.sentence}


def judge(interval: tuple[float, float] | None, predicted: float,
          rival: float) -> tuple[str, str]:
    """``(verdict, why)`` of ``interval`` against ``predicted`` (``rival``: the value it must
    also exclude to tell; see the module docstring).

    Example:
        >>> judge((0.4, 0.7), 0.5, 1.0)[0], judge((0.9, 1.2), 0.5, 1.0)[0]
        ('consistent', 'contradicted')
        >>> judge((0.3, 1.1), 0.5, 1.0)[0], judge(None, 0.5, 1.0)[0]
        ('cannot tell', 'cannot tell')
    """
    if interval is None or not all(map(math.isfinite, interval)):
        return "cannot tell", "the interval is not bounded"
    lo, hi = interval
    if hi - lo > NARROW:
        return "cannot tell", f"the interval is wider than {NARROW:g}"
    if lo <= predicted <= hi and lo <= rival <= hi:
        return "cannot tell", f"the interval holds both {predicted:g} and {rival:g}"
    if lo <= predicted <= hi:
        return "consistent", f"the interval holds {predicted:g}"
    side = "below" if hi < predicted else "above"
    return "contradicted", f"the interval lies {side} {predicted:g}"


def interval_text(estimate: float | None, interval: tuple[float, float] | None) -> str:
    """``0.51 [0.36, 0.63]``, or what is missing.

    Example:
        >>> interval_text(0.5, (0.25, 1.0)), interval_text(None, None)
        ('0.50 [0.25, 1.00]', 'not identified')
    """
    if estimate is None:
        return "not identified"
    if interval is None:
        return f"{estimate:.2f} (no interval)"
    return f"{estimate:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def regime_verdict(law: LawFit) -> Verdict:
    """alpha of ``law`` against its own regime's prediction."""
    predicted = PREDICTED_ALPHA[law.regime]
    rival = PREDICTED_ALPHA["shared" if law.regime == "independent" else "independent"]
    if law.verdict != "fits":
        verdict, why = "cannot tell", (f"the law {law.verdict} ({law.reason}), so there is no "
                                       "single alpha to compare")
    else:
        verdict, why = judge(law.alpha_ci, predicted, rival)
    sentence = (f"{_NAMES[law.regime]}: alpha = {interval_text(law.alpha, law.alpha_ci)} "
                f"against the predicted {predicted:g} ({_LAWS[law.regime]}): {verdict}; "
                f"{why}.")
    return Verdict(law.regime, predicted, law.alpha, law.alpha_ci, verdict, sentence)


def difference_verdict(shared: LawFit, independent: LawFit) -> Verdict:
    """alpha_shared - alpha_independent against the predicted +0.5."""
    predicted = PREDICTED_ALPHA["shared"] - PREDICTED_ALPHA["independent"]
    a_s, a_i, ci_s, ci_i = shared.alpha, independent.alpha, shared.alpha_ci, independent.alpha_ci
    lead = "The difference alpha_shared - alpha_independent"
    if a_s is None or a_i is None or ci_s is None or ci_i is None:
        return Verdict("shared - independent", predicted, None, None, "cannot tell",
                       f"{lead} is not identified: cannot tell.")
    d = a_s - a_i
    ci = (d - math.hypot(a_s - ci_s[0], ci_i[1] - a_i),
          d + math.hypot(ci_s[1] - a_s, a_i - ci_i[0]))
    if shared.verdict != "fits" or independent.verdict != "fits":
        verdict, why = "cannot tell", "a regime's law does not fit or is untested"
    else:
        verdict, why = judge(ci, predicted, 0.0)
    order = ("" if not all(map(math.isfinite, ci)) else
             " The order is reversed: shared m* grows more slowly with n." if ci[1] < 0 else
             " The order agrees: shared m* grows faster with n." if ci[0] > 0 else "")
    sentence = (f"{lead} = {interval_text(d, ci)} against the predicted +{predicted:g}: "
                f"{verdict}; {why}.{order}")
    return Verdict("shared - independent", predicted, d, ci, verdict, sentence)
