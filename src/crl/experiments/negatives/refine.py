"""The refinement stages of ``crl study negatives``: more runs where an m* interval is widest
(docs/negatives.md, "Refinement").

Cells are served widest first in ``log m``, whatever makes them wide (a censored cell, seed
noise, or a grid step wider than the seeds' interval): each gets runs at m spaced evenly in
``log m`` inside its interval (:func:`~crl.experiments.negatives.curves.where_to_refine`), with
the same seeds for both regimes (every seed any cell has, so the regimes stay paired), each
cell whole or not at all, until the run budget is spent. Planning is a pure function of the
cells.

A located cell whose swept m around m* are already at most :data:`~.curves.RESOLVED_STEP`
apart is resolved: the grid is no longer what limits it, and more m inside an interval the
seeds disagree over cannot narrow it (only more seeds could). In the full preset's first run, the
second and third stages spent 105 of their 123 runs on such cells (steps of 1.04 to 1.23
around m*), and the seed-noise cell at n = 1,000 widened from 0.83 to 0.97 in log m over its
two later stages. Censored cells are never resolved.
"""

from __future__ import annotations

from dataclasses import dataclass

from crl.experiments.negatives.curves import RESOLVED_STEP, CurveCell, where_to_refine


@dataclass(frozen=True)
class Addition:
    """One run the refinement asks for, and why."""

    regime: str
    n: int
    m: int
    seed: int
    reason: str


def resolved(cell: CurveCell, step: float = RESOLVED_STEP) -> bool:
    """True for a located cell whose swept m around m* are at most ``step`` apart (module
    docstring)."""
    return cell.status == "located" and cell.resolution <= step


def plan_refinement(cells: list[CurveCell], budget: int, *, points: int = 3,
                    step: float = RESOLVED_STEP) -> list[Addition]:
    """The runs of the next refinement stage, at most ``budget`` of them: ``points`` new m per
    cell that is not :func:`resolved` at ``step``, times every seed of either regime, widest
    cell first."""
    seeds = sorted({s for c in cells for s in c.seeds})
    plan: list[Addition] = []
    for cell in sorted(cells, key=lambda c: (-c.width_log, c.regime, c.n)):
        if resolved(cell, step):
            continue
        where = where_to_refine([cell], points)
        if where is None:
            continue
        reason = (f"widest in log m ({where.width_log:.2g}; {where.cause}): m inside "
                  f"[{min(where.ms):,}, {max(where.ms):,}]")
        adds = [Addition(where.regime, where.n, m, s, reason) for m in where.ms for s in seeds]
        if len(plan) + len(adds) <= budget:
            plan.extend(adds)
    return plan
