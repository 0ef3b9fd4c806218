"""The refinement stages of ``crl study negatives``: more runs where an m* interval is widest
(docs/negatives.md, "Refinement").

Cells are served widest first in ``log m``, whatever makes them wide (a censored cell, seed
noise, or a grid step wider than the seeds' interval): each gets runs at m spaced evenly in
``log m`` inside its interval (:func:`~crl.experiments.negatives.curves.where_to_refine`), with
the same seeds for both regimes (every seed any cell has, so the regimes stay paired), each
cell whole or not at all, until the run budget is spent. Planning is a pure function of the
cells.
"""

from __future__ import annotations

from dataclasses import dataclass

from crl.experiments.negatives.curves import CurveCell, where_to_refine


@dataclass(frozen=True)
class Addition:
    """One run the refinement asks for, and why."""

    regime: str
    n: int
    m: int
    seed: int
    reason: str


def plan_refinement(cells: list[CurveCell], budget: int, *, points: int = 3
                    ) -> list[Addition]:
    """The runs of the next refinement stage, at most ``budget`` of them: ``points`` new m per
    cell, times every seed of either regime, widest cell first."""
    seeds = sorted({s for c in cells for s in c.seeds})
    plan: list[Addition] = []
    for cell in sorted(cells, key=lambda c: (-c.width_log, c.regime, c.n)):
        where = where_to_refine([cell], points)
        if where is None:
            continue
        reason = (f"widest in log m ({where.width_log:.2g}; {where.cause}): m inside "
                  f"[{min(where.ms):,}, {max(where.ms):,}]")
        adds = [Addition(where.regime, where.n, m, s, reason) for m in where.ms for s in seeds]
        if len(plan) + len(adds) <= budget:
            plan.extend(adds)
    return plan
