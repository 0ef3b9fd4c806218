"""The whole answer of a negatives study from its result rows: m* per cell from curves, the law
per regime with and without its censored cells, the recommendation, the backtest, the theory's
verdicts, and how they move with the tolerance (docs/negatives.md; docs/theory.md §7).

The recommendation for the target n is the grid's prediction there (the law where it fits,
else the nearest measured cell, :func:`~.laws.recommend`) until the verify stage has measured
the target n; then it is that measurement, the verify runs read as one more cell with its own
curve and seed interval (:func:`~.laws.measured_at_target`), and the prediction is kept beside
it as an out-of-sample test of the law.

Pure functions of the rows; nothing here writes files or draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from crl.experiments.negatives.backtest import Backtest, backtest
from crl.experiments.negatives.curves import CurveCell, curve_cells
from crl.experiments.negatives.laws import (
    LawFit,
    Recommendation,
    fit_law,
    measured_at_target,
    recommend,
)
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
        cells: m* per (regime, n) of the grid. laws: Per regime, the law with its censored
            cells; laws_located: without them. recommendations, backtests: Per regime.
        verdicts: Per regime and ``shared - independent`` (when both regimes ran).
        targets: The cells the verify stage measured at the target n (per regime, at most
            one; they never enter the laws).
    """

    tolerance: Tolerance
    target_n: int
    cells: tuple[CurveCell, ...]
    laws: dict[str, LawFit]
    laws_located: dict[str, LawFit]
    recommendations: dict[str, Recommendation]
    backtests: dict[str, Backtest]
    verdicts: dict[str, Verdict]
    targets: tuple[CurveCell, ...] = ()

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
                "verdicts": {k: v.to_dict() for k, v in self.verdicts.items()},
                "target_cells": [c.to_dict() for c in self.targets]}


def answer_from_cells(cells: list[CurveCell], tolerance: Tolerance, target_n: int,
                      targets: Sequence[CurveCell] = (), *, checks: bool = True) -> Answer:
    """The :class:`Answer` from already estimated ``cells`` and, where the verify stage ran,
    the ``targets`` it measured at ``target_n`` (module docstring). ``checks=False`` leaves out
    the laws without their censored cells and the backtests (``laws_located`` and
    ``backtests`` empty): what the tolerance sensitivity's other tolerances need no more than
    the cells, laws, verdicts and recommendations.

    Raises:
        ValueError: when a target cell is not at ``target_n``.
    """
    if any(t.n != target_n for t in targets):
        raise ValueError(f"answer_from_cells: target cells must be at n = {target_n}; got "
                         f"{sorted({t.n for t in targets})}")
    regimes = [r for r in REGIMES if any(c.regime == r for c in cells)]
    laws = {r: fit_law(cells, r) for r in regimes}
    located = {r: fit_law(cells, r, with_censored=False) for r in regimes} if checks else {}
    recs = {r: recommend(laws[r], cells, target_n) for r in regimes}
    measured = {t.regime: t for t in targets if t.regime in recs}
    recs = {r: measured_at_target(measured[r], rec) if r in measured else rec
            for r, rec in recs.items()}
    tests = {r: b for r in regimes if checks and (b := backtest(cells, r)) is not None}
    verdicts = {r: regime_verdict(laws[r]) for r in regimes}
    if len(regimes) == 2:
        verdicts["shared - independent"] = difference_verdict(laws["shared"],
                                                              laws["independent"])
    return Answer(tolerance, target_n, tuple(cells), laws, located, recs, tests, verdicts,
                  tuple(measured.values()))


def answer(rows: list[dict[str, Any]], metric: str, higher: bool, tolerance: Tolerance,
           target_n: int, *, seed: int = 0,
           target_rows: Sequence[dict[str, Any]] = (), checks: bool = True) -> Answer:
    """The :class:`Answer` of ``rows`` (each with ``regime``, ``n``, ``m``, ``seed`` and
    ``metric``) at ``tolerance`` for ``target_n``; ``target_rows`` are the verify stage's
    finished runs at ``target_n`` (read as target cells); ``checks`` as in
    :func:`answer_from_cells`."""
    cells = curve_cells(rows, metric, higher, tolerance, seed=seed)
    targets = curve_cells(list(target_rows), metric, higher, tolerance, seed=seed)
    return answer_from_cells(cells, tolerance, target_n, targets, checks=checks)


def tolerance_sensitivity(rows: list[dict[str, Any]], metric: str, higher: bool,
                          tolerance: Tolerance, target_n: int, *,
                          factors: tuple[float, ...] = FACTORS, seed: int = 0,
                          target_rows: Sequence[dict[str, Any]] = ()) -> list[Answer]:
    """One :class:`Answer` per ``factor * tolerance`` (half, the chosen and twice the
    tolerance by default): m* per cell, alpha and the recommendation at each (the target
    cells re-read at each tolerance too); the laws without censored cells and the backtests
    at the chosen tolerance (factor 1) only."""
    return [answer(rows, metric, higher, tolerance.scaled(f), target_n, seed=seed,
                   target_rows=target_rows, checks=f == 1.0) for f in factors]
