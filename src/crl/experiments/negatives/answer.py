"""The whole answer of a negatives study from its result rows: m* per cell from curves, the law
per regime with and without its censored cells, the recommendation, the backtest, the theory's
verdicts, and how they move with the tolerance (docs/negatives.md; docs/theory.md §7).

Pure functions of the rows; nothing here writes files or draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crl.experiments.negatives.backtest import Backtest, backtest
from crl.experiments.negatives.curves import CurveCell, curve_cells
from crl.experiments.negatives.laws import LawFit, Recommendation, fit_law, recommend
from crl.experiments.negatives.stats import REGIMES
from crl.experiments.negatives.tolerance import Tolerance
from crl.experiments.negatives.verdict import Verdict, difference_verdict, regime_verdict

#: The tolerance factors of the sensitivity table.
FACTORS = (0.5, 1.0, 2.0)


@dataclass(frozen=True)
class Answer:
    """Everything the study concludes at one tolerance.

    Attributes:
        tolerance: The tolerance. target_n: The n the recommendation is for.
        cells: m* per (regime, n). laws: Per regime, the law with its censored cells;
            laws_located: without them. recommendations, backtests: Per regime.
        verdicts: Per regime and ``shared - independent`` (when both regimes ran).
    """

    tolerance: Tolerance
    target_n: int
    cells: tuple[CurveCell, ...]
    laws: dict[str, LawFit]
    laws_located: dict[str, LawFit]
    recommendations: dict[str, Recommendation]
    backtests: dict[str, Backtest]
    verdicts: dict[str, Verdict]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every part's own ``to_dict``."""
        return {"tolerance": {"value": self.tolerance.value,
                              "relative": self.tolerance.relative,
                              "text": str(self.tolerance)},
                "target_n": self.target_n, "cells": [c.to_dict() for c in self.cells],
                "laws": {r: law.to_dict() for r, law in self.laws.items()},
                "laws_without_censored": {r: law.to_dict()
                                          for r, law in self.laws_located.items()},
                "recommendations": {r: x.to_dict() for r, x in self.recommendations.items()},
                "backtests": {r: b.to_dict() for r, b in self.backtests.items()},
                "verdicts": {k: v.to_dict() for k, v in self.verdicts.items()}}


def answer_from_cells(cells: list[CurveCell], tolerance: Tolerance, target_n: int) -> Answer:
    """The :class:`Answer` from already estimated ``cells``."""
    regimes = [r for r in REGIMES if any(c.regime == r for c in cells)]
    laws = {r: fit_law(cells, r) for r in regimes}
    located = {r: fit_law(cells, r, with_censored=False) for r in regimes}
    recs = {r: recommend(laws[r], cells, target_n) for r in regimes}
    tests = {r: b for r in regimes if (b := backtest(cells, r)) is not None}
    verdicts = {r: regime_verdict(laws[r]) for r in regimes}
    if len(regimes) == 2:
        verdicts["shared - independent"] = difference_verdict(laws["shared"],
                                                              laws["independent"])
    return Answer(tolerance, target_n, tuple(cells), laws, located, recs, tests, verdicts)


def answer(rows: list[dict[str, Any]], metric: str, higher: bool, tolerance: Tolerance,
           target_n: int, *, seed: int = 0) -> Answer:
    """The :class:`Answer` of ``rows`` (each with ``regime``, ``n``, ``m``, ``seed`` and
    ``metric``) at ``tolerance`` for ``target_n``."""
    cells = curve_cells(rows, metric, higher, tolerance, seed=seed)
    return answer_from_cells(cells, tolerance, target_n)


def tolerance_sensitivity(rows: list[dict[str, Any]], metric: str, higher: bool,
                          tolerance: Tolerance, target_n: int, *,
                          factors: tuple[float, ...] = FACTORS, seed: int = 0
                          ) -> list[Answer]:
    """One :class:`Answer` per ``factor * tolerance`` (half, the chosen and twice the
    tolerance by default): m* per cell, alpha and the recommendation at each."""
    return [answer(rows, metric, higher, tolerance.scaled(f), target_n, seed=seed)
            for f in factors]
