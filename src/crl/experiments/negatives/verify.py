"""The verify stage of ``crl study negatives``: the recommendation measured where it is used
(docs/negatives.md, "The verify stage").

After the refinement, the study trains at the target n (by default the whole training split)
at ``m_rec / 2``, ``m_rec``, ``2 m_rec`` and the largest m of the grid, with
:data:`VERIFY_SEEDS` seeds (the grid's, topped up; at least :data:`MIN_SEEDS`) and the study's
training, and asks whether ``m_rec`` is within the
tolerance of the best of those m. The difference ``best - m_rec`` (oriented: higher is better)
is paired over seeds and its 95% interval resamples whole seeds (:mod:`.resample`). The best m
is picked on the same runs, so the difference leans towards the best's side: a "within" is
conservative, a small "not within" may be selection.

- ``within``: the mean difference and the interval's upper end are within the tolerance;
- ``within (the interval reaches past the tolerance)``: the mean only;
- ``not within``: the mean difference exceeds the tolerance.

Where ``m_rec`` is not within, the extrapolation missed at the user's n, and the study measures
there instead: one more round (:func:`plan_second_round`) adds :data:`SECOND_ROUND_POINTS` m,
evenly spaced in log m, between the largest measured m that is not within the tolerance of the
best and the smallest that is, on the same seeds.

The answer at the target n is then read like every cell of the grid (:mod:`.curves`): the verify
runs of a regime are one more cell, at the target n, whose fitted curve gives m* with an interval
that resamples whole seeds (:attr:`VerifyResult.cell`; it becomes the recommendation,
:func:`~.laws.measured_at_target`). That reading is checked on the runs themselves: the
smallest measured m at or above it (:attr:`VerifyResult.checked_m`) against the best, paired
over seeds as ``m_rec`` is (:attr:`VerifyResult.check`). Where that reading only bounds m*
(the curve still rises by more than the tolerance in its last step, or is already within it at
the smallest m), a third round (:func:`plan_third_round`, once) adds :data:`SECOND_ROUND_POINTS`
m inside those bounds, so the answer at the target n is located rather than bounded.
:attr:`VerifyResult.measured_m`, the smallest measured m whose mean is within the tolerance of
the best, with the step below it (``below_m``), is what the second round brackets. Where
the reading is located but the measured m around it are more than
:data:`~.curves.RESOLVED_STEP` apart, a resolution round (:func:`plan_resolution_round`, once)
adds :data:`SECOND_ROUND_POINTS` m inside that step, so that the grid at the target n is as fine
as the refinement leaves the cells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from crl.errors import CrlValueError
from crl.experiments.negatives.curves import RESOLVED_STEP, CurveCell, cell_tables, curve_cells
from crl.experiments.negatives.laws import Recommendation
from crl.experiments.negatives.options import VERIFY_SEEDS
from crl.experiments.negatives.resample import seed_resamples, weighted_quantile
from crl.experiments.negatives.tolerance import Tolerance

#: The fewest seeds a verify stage may train (``--verify-seeds``).
MIN_SEEDS = 3
SECOND_ROUND_POINTS = 2


@dataclass(frozen=True)
class VerifyPlan:
    """The runs of the verify stage for one regime: m at ``target_n`` times ``seeds``."""

    regime: str
    target_n: int
    m_rec: int
    ms: tuple[int, ...]
    seeds: tuple[int, ...]
    source: str
    second_round: tuple[int, ...] = ()
    third_round: tuple[int, ...] = ()
    resolution_round: tuple[int, ...] = ()

    @property
    def all_ms(self) -> tuple[int, ...]:
        """Every m trained at the target n: the first round's and the later ones'."""
        return tuple(sorted(set(self.ms) | set(self.second_round) | set(self.third_round)
                            | set(self.resolution_round)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``verify.json``)."""
        return {"regime": self.regime, "target_n": self.target_n, "m_rec": self.m_rec,
                "ms": list(self.ms), "seeds": list(self.seeds), "source": self.source,
                "second_round": list(self.second_round),
                "third_round": list(self.third_round),
                "resolution_round": list(self.resolution_round)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VerifyPlan:
        """The plan ``verify.json`` recorded (files written before a later round have
        none of it)."""
        return cls(str(d["regime"]), int(d["target_n"]), int(d["m_rec"]),
                   tuple(int(m) for m in d["ms"]), tuple(int(s) for s in d["seeds"]),
                   str(d["source"]), tuple(int(m) for m in d.get("second_round", ())),
                   tuple(int(m) for m in d.get("third_round", ())),
                   tuple(int(m) for m in d.get("resolution_round", ())))


def verify_seeds(seeds: tuple[int, ...], count: int = VERIFY_SEEDS) -> tuple[int, ...]:
    """The grid's seeds, topped up to ``count`` with the next integers (a grid with more seeds
    keeps them all).

    Example:
        >>> verify_seeds((0, 1)), verify_seeds((0, 1), 3), verify_seeds((0, 1, 2, 3), 3)
        ((0, 1, 2, 3, 4), (0, 1, 2), (0, 1, 2, 3))
    """
    if count < MIN_SEEDS:
        raise CrlValueError(f"study negatives: `--verify-seeds` must be at least {MIN_SEEDS}; "
                            f"got {count}")
    out = list(seeds)
    extra = max(seeds, default=-1) + 1
    while len(out) < count:
        out.append(extra)
        extra += 1
    return tuple(out)


def plan_verify(recommendations: dict[str, Recommendation], target_n: int, largest_m: int,
                seeds: tuple[int, ...], count: int = VERIFY_SEEDS) -> list[VerifyPlan]:
    """One :class:`VerifyPlan` per regime whose recommendation gives a value (its point, or
    the lower bound of a censored cell); m clipped to ``[1, target_n]``; the grid's ``seeds``
    topped up to ``count`` (:func:`verify_seeds`)."""
    plans = []
    for regime, rec in recommendations.items():
        value = rec.m if rec.m is not None else rec.low if rec.low > 0 else None
        if value is None or not math.isfinite(value):
            continue
        m_rec = min(max(1, round(value)), target_n)
        ms = sorted({min(max(1, round(x)), target_n)
                     for x in (value / 2, m_rec, 2 * value, largest_m)})
        source = rec.source if rec.m is not None else f"{rec.source} (its lower bound)"
        plans.append(VerifyPlan(regime, target_n, m_rec, tuple(ms), verify_seeds(seeds, count),
                                source))
    return plans


@dataclass(frozen=True)
class PairedCheck:
    """``best - m`` at the target n for one measured ``m``, paired over seeds.

    Attributes:
        m: The m checked. difference: The mean over seeds of ``score(best) - score(m)``
            (oriented: higher is better). interval: Its 95% interval over seed resamples.
        verdict: ``within``, ``within (the interval reaches past the tolerance)`` or ``not
            within`` (module docstring).
    """

    m: int
    difference: float
    interval: tuple[float, float]
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"m": self.m, "difference": self.difference, "interval": list(self.interval),
                "verdict": self.verdict}


def _paired(table: np.ndarray, best: int, k: int, counts: np.ndarray, weights: np.ndarray,
            tol: float, m: int) -> PairedCheck:
    """The :class:`PairedCheck` of column ``k`` of ``table (S, M)`` against column ``best``,
    over the seed resamples ``counts (R, S)`` with ``weights (R,)``."""
    diff = table[:, best] - table[:, k]  # (S,) paired
    draws = counts @ diff / table.shape[0]
    interval = (weighted_quantile(draws, weights, 0.025),
                weighted_quantile(draws, weights, 0.975))
    point = float(diff.mean())
    verdict = ("not within" if point > tol else "within" if interval[1] <= tol
               else "within (the interval reaches past the tolerance)")
    return PairedCheck(m, point, interval, verdict)


@dataclass(frozen=True)
class VerifyResult:
    """What the verify runs measured for one regime.

    Attributes:
        plan: What was planned. ms, means: The m measured and their mean scores over seeds
            (oriented). best_m: The best of them. difference, interval: ``best - m_rec``
            paired over ``seeds``, and its 95% interval. tolerance_points: The tolerance in
            metric units (relative to the best). verdict: See the module docstring.
        measured_m, below_m: The smallest measured m within the tolerance of the best (by
            the means) and the measured m below it (None: none below).
        cell: The verify runs read as a cell at the target n (None with fewer than 2 m).
        check: The smallest measured m at or above the cell's m* (its lower bound when the
            curve only bounds m* from below; the largest m when m* lies beyond the measured
            m) against the best, paired over seeds (None without a cell).
    """

    plan: VerifyPlan
    ms: tuple[int, ...]
    means: tuple[float, ...]
    best_m: int
    difference: float
    interval: tuple[float, float]
    tolerance_points: float
    seeds: tuple[int, ...]
    exact: bool
    num_resamples: int
    verdict: str
    measured_m: int
    below_m: int | None
    cell: CurveCell | None = None
    check: PairedCheck | None = None

    @property
    def checked_m(self) -> int | None:
        """The measured m the reading was checked at (:attr:`check`)."""
        return None if self.check is None else self.check.m

    def to_dict(self, higher: bool = True) -> dict[str, Any]:
        """JSON-ready; ``means`` in the metric's own direction."""
        sign = 1.0 if higher else -1.0
        return {**self.plan.to_dict(), "measured_ms": list(self.ms),
                "means": [sign * v for v in self.means], "best_m": self.best_m,
                "difference": self.difference, "interval": list(self.interval),
                "tolerance_points": self.tolerance_points, "seeds": list(self.seeds),
                "exact": self.exact, "num_resamples": self.num_resamples,
                "verdict": self.verdict, "measured_m": self.measured_m,
                "below_m": self.below_m,
                "cell": None if self.cell is None else self.cell.to_dict(),
                "check": None if self.check is None else self.check.to_dict()}


def verify_result(plan: VerifyPlan, rows: list[dict[str, Any]], metric: str, higher: bool,
                  tolerance: Tolerance) -> VerifyResult | None:
    """The :class:`VerifyResult` of ``plan`` from the verify ``rows`` (None until m_rec and
    one other m have runs on a common seed)."""
    found = cell_tables(rows, metric, higher).get((plan.regime, plan.target_n))
    if found is None:
        return None
    ms_f, seeds_f, table = found
    ms = [int(m) for m in ms_f]
    if plan.m_rec not in ms or len(ms) < 2 or any(
            m not in ms for m in (*plan.second_round, *plan.third_round,
                                  *plan.resolution_round)):
        return None
    keep = [k for k in range(len(seeds_f)) if np.isfinite(table[k]).all()]  # paired seeds
    if not keep:
        return None
    table = table[keep]
    seeds = tuple(seeds_f[k] for k in keep)
    means = table.mean(axis=0)
    best = int(np.argmax(means))
    rng = np.random.default_rng([plan.target_n, len(seeds)])
    counts, weights, exact = seed_resamples(len(seeds), rng)
    tol = tolerance.points(float(means[best]))
    of_rec = _paired(table, best, ms.index(plan.m_rec), counts, weights, tol, plan.m_rec)
    within = [k for k in range(len(ms)) if means[best] - means[k] <= tol]  # best's included
    first = min(within)
    mine = [r for r in rows if r.get("regime") == plan.regime
            and int(r["n"]) == plan.target_n and int(r["seed"]) in seeds]
    cells = curve_cells(mine, metric, higher, tolerance)
    cell = cells[0] if cells else None
    check = None
    if cell is not None:
        reading = cell.m_star if cell.m_star is not None else \
            cell.lower if cell.status == "above" else cell.upper
        k = next((k for k, m in enumerate(ms) if m >= reading - 1e-9), len(ms) - 1)
        check = _paired(table, best, k, counts, weights, tol, ms[k])
    return VerifyResult(plan, tuple(ms), tuple(float(v) for v in means), ms[best],
                        of_rec.difference, of_rec.interval, tol, seeds, exact, len(weights),
                        of_rec.verdict, ms[first], ms[first - 1] if first > 0 else None,
                        cell, check)


def plan_second_round(result: VerifyResult) -> VerifyPlan:
    """The plan with a second round where ``m_rec`` is not within the tolerance:
    :data:`SECOND_ROUND_POINTS` m evenly spaced in log m inside ``(below_m, measured_m)``,
    the bracket of the answer at the target n (none where the bracket has no integer inside,
    or ``m_rec`` is within).

    Example:
        >>> plan = VerifyPlan("shared", 4000, 500, (250, 500, 1000, 4000), (0, 1, 2), "law")
        >>> r = VerifyResult(plan, plan.ms, (0.5, 0.52, 0.6, 0.605), 4000, 0.085,
        ...                  (0.07, 0.1), 0.00605, (0, 1, 2), True, 10, "not within", 1000, 500)
        >>> plan_second_round(r).second_round
        (630, 794)
    """
    plan = result.plan
    if result.verdict != "not within" or result.below_m is None or plan.second_round:
        return plan
    lo, hi = math.log(result.below_m), math.log(result.measured_m)
    step = (hi - lo) / (SECOND_ROUND_POINTS + 1)
    points = {round(math.exp(lo + k * step)) for k in range(1, SECOND_ROUND_POINTS + 1)}
    new = tuple(sorted(m for m in points if result.below_m < m < result.measured_m))
    return VerifyPlan(plan.regime, plan.target_n, plan.m_rec, plan.ms, plan.seeds,
                      plan.source, new)


def plan_third_round(result: VerifyResult) -> VerifyPlan:
    """The plan with a third round where the runs at the target n only bound m*
    (:attr:`VerifyResult.cell` censored): :data:`SECOND_ROUND_POINTS` m evenly spaced in log m
    inside the bounds (below the smallest measured m, halving, when m* is at most that), none
    where the reading is located, the bounds hold no new integer, or a third round was planned.

    Example:
        >>> from crl.experiments.negatives.curves import estimate_curve_cell
        >>> plan = VerifyPlan("shared", 4000, 500, (250, 500, 1000, 4000), (0, 1, 2), "law")
        >>> table = np.array([[0.50, 0.55, 0.58, 0.62], [0.51, 0.56, 0.59, 0.63],
        ...                   [0.50, 0.56, 0.58, 0.62]])
        >>> cell = estimate_curve_cell("shared", 4000, plan.ms, (0, 1, 2), table,
        ...                            Tolerance(0.01), rng=np.random.default_rng(0))
        >>> cell.status, cell.lower
        ('above', 1000)
        >>> r = VerifyResult(plan, plan.ms, (0.5, 0.56, 0.58, 0.62), 4000, 0.06, (0.05, 0.07),
        ...                  0.0062, (0, 1, 2), True, 10, "not within", 4000, 1000, cell)
        >>> plan_third_round(r).third_round
        (1587, 2520)
    """
    plan, cell = result.plan, result.cell
    if cell is None or cell.m_star is not None or plan.third_round:
        return plan
    measured = set(plan.all_ms)
    if cell.status == "below":
        points = {round(cell.upper / 2 ** k) for k in range(1, SECOND_ROUND_POINTS + 1)}
        new = tuple(sorted(m for m in points if 1 <= m < cell.upper and m not in measured))
    elif math.isfinite(cell.upper) and cell.lower > 0:
        lo, hi = math.log(cell.lower), math.log(cell.upper)
        step = (hi - lo) / (SECOND_ROUND_POINTS + 1)
        points = {round(math.exp(lo + k * step)) for k in range(1, SECOND_ROUND_POINTS + 1)}
        new = tuple(sorted(m for m in points
                           if cell.lower < m < cell.upper and m not in measured))
    else:
        return plan
    if not new:
        return plan
    return VerifyPlan(plan.regime, plan.target_n, plan.m_rec, plan.ms, plan.seeds,
                      plan.source, plan.second_round, new)


def plan_resolution_round(result: VerifyResult, step: float = RESOLVED_STEP) -> VerifyPlan:
    """The plan with a resolution round where the reading at the target n is located but the
    measured m around it are more than ``step`` apart (the refinement's
    :data:`~.curves.RESOLVED_STEP`): :data:`SECOND_ROUND_POINTS` m evenly spaced in log m
    inside that step, so that the grid at the target n is no coarser than the grid's cells are
    refined to; none where the reading only bounds m*, the step is fine already, or the round
    was planned.

    A seed interval is read on the m measured: where m* falls in a wide step, the curve's
    form between two far-apart m decides where in the step it lies, and the seeds cannot say
    so. The quick preset at the full preset's budget read independent m* = 4,676 [4,278, 5,132]
    inside a step from 4,182 to 6,791 (1.62x), where the full preset, whose m there were 1.26x
    apart, read 5,357 [4,531, 6,320] on the same seeds (docs/negatives.md, "The verify stage").

    Example:
        >>> from crl.experiments.negatives.curves import estimate_curve_cell
        >>> plan = VerifyPlan("shared", 4000, 500, (250, 500, 1000, 4000), (0, 1, 2), "law")
        >>> table = np.array([[0.50, 0.60, 0.615, 0.62], [0.51, 0.61, 0.625, 0.63],
        ...                   [0.50, 0.60, 0.615, 0.62]])
        >>> cell = estimate_curve_cell("shared", 4000, plan.ms, (0, 1, 2), table,
        ...                            Tolerance(0.01), rng=np.random.default_rng(0))
        >>> cell.status, 500 < cell.m_star < 1000
        ('located', True)
        >>> r = VerifyResult(plan, plan.ms, (0.5, 0.6, 0.615, 0.62), 4000, 0.02, (0.01, 0.03),
        ...                  0.0062, (0, 1, 2), True, 10, "not within", 1000, 500, cell)
        >>> plan_resolution_round(r).resolution_round
        (630, 794)
    """
    plan, cell = result.plan, result.cell
    if cell is None or cell.m_star is None or plan.resolution_round:
        return plan
    measured = sorted(plan.all_ms)
    above = next((k for k, m in enumerate(measured) if m >= cell.m_star - 1e-9), None)
    if above is None or above == 0:
        return plan
    lo, hi = measured[above - 1], measured[above]
    if hi / lo <= step:
        return plan
    gap = (math.log(hi) - math.log(lo)) / (SECOND_ROUND_POINTS + 1)
    points = {round(math.exp(math.log(lo) + k * gap)) for k in range(1, SECOND_ROUND_POINTS + 1)}
    new = tuple(sorted(m for m in points if lo < m < hi))
    if not new:
        return plan
    return VerifyPlan(plan.regime, plan.target_n, plan.m_rec, plan.ms, plan.seeds,
                      plan.source, plan.second_round, plan.third_round, new)


def verify_text(r: VerifyResult, metric: str, higher: bool) -> str:
    """The measurement at the user's n in a few sentences (every number is in
    ``analysis.json``)."""
    sign = 1.0 if higher else -1.0
    scores = ", ".join(f"m = {m:,}: {sign * v:.3f}" for m, v in zip(r.ms, r.means, strict=True))
    return (f"Measured at n = {r.plan.target_n:,} (the verify stage, {len(r.seeds)} seeds): "
            f"{metric} {scores}. The best is m = {r.best_m:,}; m_rec = {r.plan.m_rec:,} (the "
            f"grid's prediction the stage was planned with, from the {r.plan.source}) is "
            f"{r.difference:.3f} below it, paired over seeds [{r.interval[0]:.3f}, "
            f"{r.interval[1]:.3f}] ({r.num_resamples} "
            f"{'exact' if r.exact else 'random'} seed resamples), against the tolerance "
            f"{r.tolerance_points:.3g}: {r.verdict}. " + measured_text(r))


def measured_text(r: VerifyResult) -> str:
    """The answer at the target n, read from the verify runs' own curve, and its check."""
    later = [(word, ms) for word, ms in (("second", r.plan.second_round),
                                         ("third", r.plan.third_round),
                                         ("resolution", r.plan.resolution_round)) if ms]
    rounds = (" (with " + " and ".join(f"a {word} round at m = {', '.join(f'{m:,}' for m in ms)}"
                                       for word, ms in later) + ")" if later else "")
    cell, check = r.cell, r.check
    if cell is None or check is None:
        return (f"The runs at the target n{rounds} give no curve; the smallest measured m "
                f"within the tolerance of the best is {r.measured_m:,}.")
    if cell.m_star is not None:
        reading = (f"m* = {cell.m_star:,.0f}, 95% interval [{cell.lower:,.0f}, "
                   f"{cell.upper:,.0f}] over seed resamples")
    else:
        reading = f"only bounds m* ({cell.reason})"
    lead = (f"Read from the runs at the target n{rounds} like every cell ({cell.method} "
            f"curve, {cell.method_reason}): {reading}; this is the recommendation.")
    return (lead + f" Checked on the runs: m = {check.m:,}, the smallest measured m at or above "
            f"that reading, is {check.difference:.3f} below the best [{check.interval[0]:.3f}, "
            f"{check.interval[1]:.3f}]: {check.verdict} the tolerance.")
