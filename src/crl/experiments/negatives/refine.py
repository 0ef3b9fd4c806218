"""The second stage of ``crl study negatives``: more runs where a cell's m* interval is wide.

A located cell whose interval spans more than one step of its swept m, or is wider than a factor
:data:`~crl.experiments.negatives.stats.GOOD_WIDTH`, gets runs at the geometric midpoints of the
swept m inside its interval (for every seed it has, so the new m stay paired); when the
bootstrap over seeds itself disagrees on m* (noise, not the grid, is the problem) it also gets
one more seed at every m it has. Cells are served widest first, each one whole or not at all,
until the run budget is spent. Planning is a pure function of the estimates.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from crl.experiments.negatives.stats import GOOD_WIDTH, CellEstimate

#: Midpoints closer than this ratio to a swept m are not worth a run.
MIN_STEP = 1.25


@dataclass(frozen=True)
class Addition:
    """One run the refinement asks for, and why."""

    regime: str
    n: int
    m: int
    seed: int
    reason: str


def _needs(cell: CellEstimate) -> bool:
    if cell.status != "located":
        return False
    inside = [m for m in cell.ms if cell.lower < m < cell.upper]
    return bool(inside) or cell.width > GOOD_WIDTH


def _midpoints(cell: CellEstimate) -> list[int]:
    span = [m for m in cell.ms if cell.lower <= m <= cell.upper]
    out = []
    for a, b in itertools.pairwise(span):
        mid = round(math.sqrt(a * b))
        if b / a >= MIN_STEP ** 2 and mid not in cell.ms and a < mid < b:
            out.append(mid)
    return out


def _noisy(cell: CellEstimate) -> bool:
    return len(set(cell.draws)) > 1


def cell_additions(cell: CellEstimate, next_seed: int) -> list[Addition]:
    """The runs that would narrow ``cell``'s interval (empty when it needs none)."""
    if not _needs(cell):
        return []
    adds = [Addition(cell.regime, cell.n, m, s, f"m between swept values in [{cell.lower:g}, "
                     f"{cell.upper:g}]") for m in _midpoints(cell) for s in cell.seeds]
    if _noisy(cell):
        adds += [Addition(cell.regime, cell.n, m, next_seed, "one more seed: the seeds "
                          "disagree on m*") for m in cell.ms]
    return adds


def plan_refinement(cells: list[CellEstimate], budget: int) -> list[Addition]:
    """The runs of the next refinement stage, at most ``budget`` of them.

    Example:
        >>> from crl.experiments.negatives.stats import CellEstimate
        >>> cell = CellEstimate("shared", 1000, (10, 100, 1000), (0, 1), (0.1, 0.3, 0.3),
        ...                     (0.0, 0.0, 0.0), 100, 100, 0.2, "located", 10.0, 100.0,
        ...                     (100, 100), ("located", "located"))
        >>> [(a.m, a.seed) for a in plan_refinement([cell], 10)]
        [(32, 0), (32, 1)]
    """
    next_seed = 1 + max((s for c in cells for s in c.seeds), default=-1)
    plan: list[Addition] = []
    for cell in sorted(cells, key=lambda c: -c.width):
        adds = cell_additions(cell, next_seed)
        if adds and len(plan) + len(adds) <= budget:
            plan.extend(adds)
    return plan
