"""m* per (regime, n) read from fitted curves, with exact seed resampling
(docs/negatives.md, "The statistics"; docs/theory.md §5 and §7).

Per cell, the scores (oriented so that higher is better) form a table ``score[s, m]`` over
seeds and swept m. Runs with one seed share the initialisation and the data order, so the curve
is fitted to the seed-adjusted means ``mu_m`` of ``score[s, m] = mu_m + b_s + noise``
(:func:`~crl.experiments.negatives.stats.additive_means`), weighted by the seeds at each m.

- **Which curve.** The saturating form ``plateau - gap (m / m_1)^-beta`` is used when its
  lack-of-fit F test against the per-m means passes (p >= :data:`LACK_OF_FIT_P`); otherwise,
  or when the test cannot be run (fewer than 4 swept m, no residual degrees of freedom), the
  isotonic fit is (:mod:`.curvefit`). The choice is made once, on the pooled means, and
  recorded (``method``, ``method_reason``); the resamples and the per-seed curves use it too.
- **m\\*.** The *reference* is the fitted curve's value at the largest swept m, which is its
  maximum over the swept range (both curves are non-decreasing). The parametric asymptote is not
  used: where the grid reaches ``m = n`` it lies beyond every m a user can choose, and it would
  make every still-rising curve unsaturated. m* is the smallest m where the curve comes within
  the tolerance of the reference, read on the curve between swept m (linear in ``log m`` for
  the isotonic fit), not a grid point.
- **Censoring.** ``below`` when the curve at the smallest swept m is already within the
  tolerance (``m* <= m_1``). ``above`` when m* falls in the last swept step (the curve still
  rises by more than the tolerance there: ``m* >= m_{M-1}``, and ``m* <= m_M`` when the grid
  reaches ``n - 1``, every other sample), or when the grid stops short of ``n - 1`` and the
  curve is still rising at its top (``m* >=`` the reading). No point is given for either.
- **Interval.** Every seed resample (:mod:`.resample`, exact enumeration up to 2,000 distinct
  resamples) gives a reading; a located reading is a point, a censored one its bound interval.
  The cell's 95% interval runs from the weighted 2.5% quantile of the readings' lower ends to
  the 97.5% quantile of their upper ends. It measures seed noise only: the grid's resolution,
  the ratio of the swept m around m*, is stated beside it as a limit of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crl.experiments.negatives.curvefit import (
    Curve,
    FloatArray,
    Isotonic,
    LackOfFit,
    isotonic,
    lack_of_fit,
    saturating,
)
from crl.experiments.negatives.resample import seed_resamples, weighted_quantile
from crl.experiments.negatives.stats import REGIMES, additive_means, score_table
from crl.experiments.negatives.tolerance import Tolerance

#: The saturating form is used when its lack-of-fit p-value is at least this.
LACK_OF_FIT_P = 0.05

#: A located cell whose swept m around m* are at most this ratio apart is resolved by its grid
#: (+-11% about the step's geometric middle): m* is read on the measured means there
#: (:func:`choose_reading`), and the refinement gives it no more m (:mod:`.refine`).
RESOLVED_STEP = 1.25


@dataclass(frozen=True)
class Reading:
    """m* read from one curve: ``status`` (``located``/``above``/``below``), the point (None
    unless located) and the bounds ``[lower, upper]`` (equal when located; 0 or inf when
    open)."""

    status: str
    m_star: float | None
    lower: float
    upper: float


def read_m_star(curve: Curve, ms: tuple[float, ...], n: int, tolerance: Tolerance) -> Reading:
    """m* on ``curve`` over the swept ``ms`` ``(M,)`` of a cell with ``n`` anchors (see the
    module docstring for the reference level and the censoring rules)."""
    top = curve.at(ms[-1])
    level = top - tolerance.points(top)
    reaches_all = ms[-1] >= n - 1
    if curve.at(ms[0]) >= level:
        return Reading("below", None, 0.0, ms[0])
    m = min(max(curve.first_reaching(level), ms[0]), ms[-1])
    if len(ms) > 1 and m > ms[-2]:
        return Reading("above", None, ms[-2], ms[-1] if reaches_all else math.inf)
    rising = (curve.rising_at_top() if isinstance(curve, Isotonic)
              else curve.at(n - 1) - top > tolerance.points(top))
    if not reaches_all and rising:
        return Reading("above", None, m, math.inf)
    return Reading("located", m, m, m)


@dataclass(frozen=True)
class SeedReading:
    """m* of one seed's own curve (the same method as the pooled one)."""

    seed: int
    reading: Reading


@dataclass(frozen=True)
class SeedSpread:
    """What the seed resamples of one cell give (:func:`seed_spread`)."""

    lower: float
    upper: float
    exact: bool
    num_resamples: int
    per_seed: tuple[SeedReading, ...]


@dataclass(frozen=True)
class CurveCell:
    """m* of one (regime, n) cell read from its fitted curve.

    Attributes:
        regime, n: The cell. ms, seeds: Swept m ``(M,)`` ascending, seeds ``(S,)``.
        means: Seed-adjusted means ``(M,)`` (oriented: higher is better). fitted: The used
            curve at ``ms`` ``(M,)``.
        method: ``saturating`` or ``isotonic``; method_reason: why.
        lack_of_fit: The saturating form's F test (None with fewer than 3 swept m).
        curve: The used curve. tolerance_points: The tolerance in metric units.
        status, m_star: The pooled reading (m_star None unless located).
        lower, upper: The 95% resampling interval of m* (0 / inf where open).
        resolution: The ratio of the swept m around m* (the grid's own limit).
        exact, num_resamples: Whether every seed resample was enumerated, and how many.
        per_seed: Each seed's own reading. reason: Why m_star is None, else empty.
    """

    regime: str
    n: int
    ms: tuple[float, ...]
    seeds: tuple[int, ...]
    means: tuple[float, ...]
    fitted: tuple[float, ...]
    method: str
    method_reason: str
    lack_of_fit: LackOfFit | None
    curve: Curve = field(repr=False)
    tolerance_points: float
    status: str
    m_star: float | None
    lower: float
    upper: float
    resolution: float
    exact: bool
    num_resamples: int
    per_seed: tuple[SeedReading, ...] = field(repr=False)
    reason: str = ""

    @property
    def width_log(self) -> float:
        """The interval's width in ``log m``, at least the grid step's (inf where open)."""
        seeds = (math.log(self.upper / self.lower) if self.lower > 0
                 and math.isfinite(self.upper) else math.inf)
        return max(seeds, math.log(self.resolution))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (no inf: open ends are None)."""
        def num(v: float | None) -> float | None:
            return v if v is not None and math.isfinite(v) else None
        return {"regime": self.regime, "n": self.n, "ms": list(self.ms),
                "seeds": list(self.seeds), "means": list(self.means),
                "fitted": list(self.fitted), "method": self.method,
                "method_reason": self.method_reason,
                "lack_of_fit_p": None if self.lack_of_fit is None else self.lack_of_fit.p_value,
                "tolerance_points": self.tolerance_points, "status": self.status,
                "m_star": self.m_star,
                "m_star_over_n": None if self.m_star is None else self.m_star / self.n,
                "interval": [num(self.lower), num(self.upper)],
                "resolution": self.resolution, "exact": self.exact,
                "num_resamples": self.num_resamples, "reason": self.reason,
                "per_seed": {str(s.seed): s.reading.m_star for s in self.per_seed}}


def _columns(table: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Seed-adjusted means ``(M,)`` and seeds per m ``(M,)`` of ``table`` ``(S, M)``."""
    return additive_means(table), np.isfinite(table).sum(axis=0).astype(np.float64)


def _fit(method: str, ms: FloatArray, means: FloatArray, weights: FloatArray) -> Curve:
    if method == "saturating":
        fit = saturating(ms, means, weights)
        if fit is not None:
            return fit
    return isotonic(ms, means, weights)


def choose_curve(table: FloatArray, ms: FloatArray) -> tuple[str, str, LackOfFit | None]:
    """``(method, reason, test)`` for the pooled curve of ``table`` ``(S, M)`` at ``ms``."""
    means, weights = _columns(table)
    fit = saturating(ms, means, weights)
    if fit is None:
        return "isotonic", f"{len(ms)} swept m: too few for the saturating form", None
    test = lack_of_fit(table, means, ms, fit)
    if test.p_value is None:
        return "isotonic", f"saturating form {test.reason}", test
    if fit.gap <= 0:
        return "isotonic", "the saturating fit is flat (no gain with m)", test
    if test.p_value < LACK_OF_FIT_P:
        return "isotonic", (f"the saturating form does not fit (lack-of-fit p = "
                            f"{test.p_value:.3g} < {LACK_OF_FIT_P})"), test
    return "saturating", f"the saturating form fits (lack-of-fit p = {test.p_value:.3g})", test


def choose_reading(table: FloatArray, ms: FloatArray, n: int, tolerance: Tolerance
                   ) -> tuple[str, str, LackOfFit | None]:
    """``(method, reason, test)`` for reading m* from ``table`` ``(S, M)`` at ``ms`` in a cell
    with ``n`` anchors: the isotonic fit where its pooled reading is located between swept m at
    most :data:`RESOLVED_STEP` apart (the measured means bracket m* on their own, and a fitted form
    would only add the dependence of its shape on the m far from m*), otherwise
    :func:`choose_curve`'s choice. ``test`` is the saturating form's lack-of-fit test either
    way."""
    method, why, test = choose_curve(table, ms)
    if method == "isotonic":
        return method, why, test
    means, weights = _columns(table)
    grid = tuple(float(m) for m in ms)
    reading = read_m_star(isotonic(ms, means, weights), grid, n, tolerance)
    step = _resolution(grid, reading)
    if reading.status == "located" and step <= RESOLVED_STEP:
        return "isotonic", (f"the swept m around m* are {step:.3g}x apart (at most "
                            f"{RESOLVED_STEP:.3g}x): read on the measured means; {why}"), test
    return method, why, test


def _reading(table: FloatArray, ms: FloatArray, n: int, method: str,
             tolerance: Tolerance) -> Reading:
    """The reading of ``table`` ``(S', M)`` (columns without runs dropped)."""
    keep = np.isfinite(table).any(axis=0)
    if keep.sum() < 2:
        return Reading("below", None, 0.0, math.inf)  # nothing to read: no bound
    means, weights = _columns(table[:, keep])
    curve = _fit(method, ms[keep], means, weights)
    return read_m_star(curve, tuple(float(m) for m in ms[keep]), n, tolerance)


def _resolution(ms: tuple[float, ...], reading: Reading) -> float:
    if reading.status == "below":
        j = 1
    elif reading.status == "above" and reading.lower >= ms[-2]:
        j = len(ms) - 1
    else:
        j = int(np.searchsorted(ms, reading.lower, side="left"))
        j = min(max(j, 1), len(ms) - 1)
    return ms[j] / ms[j - 1]


def _reason(reading: Reading, ms: tuple[float, ...]) -> str:
    if reading.status == "below":
        return (f"saturated at the smallest swept m: m* <= {ms[0]:g} (the curve is within the "
                "tolerance of its top there)")
    if reading.status == "above":
        top = "" if math.isinf(reading.upper) else f" and <= {reading.upper:g}"
        return (f"not saturated: the curve still rises by more than the tolerance: m* >= "
                f"{reading.lower:g}{top}")
    return ""


def seed_spread(table: FloatArray, seeds: tuple[int, ...], pooled: Reading,
                read: Callable[[FloatArray], Reading], rng: np.random.Generator, *,
                max_exact: int, num_draws: int) -> SeedSpread:
    """The interval of the reading over every seed resample of ``table`` ``(S, M)``, and each
    seed's own reading: ``read`` turns a resampled table ``(S', M)`` into a :class:`Reading`;
    the interval is the resamples' 2.5% quantile of ``lower`` to their 97.5% quantile of
    ``upper``, widened to hold the ``pooled`` reading (:mod:`.resample`)."""
    counts, w, exact = seed_resamples(len(seeds), rng, max_exact=max_exact, num_draws=num_draws)
    lo, hi = [], []
    for row in counts:
        r = read(table[np.repeat(np.arange(len(seeds)), row)])
        lo.append(r.lower)
        hi.append(r.upper)
    lower = min(pooled.lower, weighted_quantile(np.array(lo), w, 0.025))
    upper = max(pooled.upper, weighted_quantile(np.array(hi), w, 0.975))
    per_seed = tuple(SeedReading(s, read(table[[k]])) for k, s in enumerate(seeds))
    return SeedSpread(lower, upper, exact, len(w), per_seed)


def estimate_curve_cell(regime: str, n: int, ms: tuple[float, ...], seeds: tuple[int, ...],
                        table: FloatArray, tolerance: Tolerance, *,
                        rng: np.random.Generator, max_exact: int = 2000,
                        num_draws: int = 2000) -> CurveCell:
    """The :class:`CurveCell` of ``table`` ``(S, M)`` (seeds by swept ``ms``, NaN = no run).

    Raises:
        ValueError: with fewer than 2 swept m.
    """
    if len(ms) < 2:
        raise ValueError(f"estimate_curve_cell: need >= 2 swept m for ({regime}, {n}); got "
                         f"{list(ms)}")
    grid = np.asarray(ms, dtype=np.float64)
    method, why, test = choose_reading(table, grid, n, tolerance)
    means, weights = _columns(table)
    curve = _fit(method, grid, means, weights)
    pooled = read_m_star(curve, ms, n, tolerance)
    spread = seed_spread(table, seeds, pooled,
                         lambda sub: _reading(sub, grid, n, method, tolerance), rng,
                         max_exact=max_exact, num_draws=num_draws)
    top = curve.at(ms[-1])
    return CurveCell(regime, n, ms, seeds, tuple(means.tolist()),
                     tuple(curve.at(m) for m in ms), method, why, test, curve,
                     tolerance.points(top), pooled.status, pooled.m_star, spread.lower,
                     spread.upper, _resolution(ms, pooled), spread.exact,
                     spread.num_resamples, spread.per_seed, _reason(pooled, ms))


def cell_tables(rows: list[dict[str, Any]], metric: str, higher: bool
                ) -> dict[tuple[str, int], tuple[tuple[float, ...], tuple[int, ...],
                                                 FloatArray]]:
    """Per (regime, n): ``(ms, seeds, table (S, M))`` of oriented scores (NaN = no run)."""
    out = {}
    for key, runs in score_table(rows, metric, higher).items():
        ms = tuple(sorted({m for _, m in runs}))
        seeds = tuple(sorted({s for s, _ in runs}))
        table = np.full((len(seeds), len(ms)), np.nan)
        for (s, m), v in runs.items():
            table[seeds.index(s), ms.index(m)] = v
        out[key] = (tuple(float(m) for m in ms), seeds, table)
    return out


def curve_cells(rows: list[dict[str, Any]], metric: str, higher: bool, tolerance: Tolerance,
                *, seed: int = 0, max_exact: int = 2000, num_draws: int = 2000
                ) -> list[CurveCell]:
    """:func:`estimate_curve_cell` for every (regime, n) of ``rows`` with >= 2 swept m; each
    cell's random draws (only used beyond ``max_exact`` resamples) depend on ``(seed, regime,
    n)`` alone, so a cell's answer does not depend on the other cells."""
    out = []
    for (regime, n), (ms, seeds, table) in sorted(cell_tables(rows, metric, higher).items()):
        if len(ms) >= 2:
            code = REGIMES.index(regime) if regime in REGIMES else len(REGIMES)
            rng = np.random.default_rng([seed, code, n])
            out.append(estimate_curve_cell(regime, n, ms, seeds, table, tolerance, rng=rng,
                                           max_exact=max_exact, num_draws=num_draws))
    return out


@dataclass(frozen=True)
class RefinePlan:
    """Where the next runs should go: the cell with the widest interval in ``log m``.

    Attributes:
        regime, n: The cell. width_log: Its interval's width in ``log m``.
        cause: ``censored``, ``seed noise`` or ``grid step`` (what makes it widest).
        ms: New m inside its interval. seeds: The seeds to run them with, the union over all
            cells of both regimes (so the regimes stay paired).
    """

    regime: str
    n: int
    width_log: float
    cause: str
    ms: tuple[int, ...]
    seeds: tuple[int, ...]


def where_to_refine(cells: list[CurveCell], points: int = 3) -> RefinePlan | None:
    """The :class:`RefinePlan` for ``cells``: ``points`` m spaced evenly in ``log m`` strictly
    inside the widest cell's interval, or inside the grid step around its m* when that step is
    wider than the seeds' interval (an open end is replaced by a quarter of the smallest swept
    m, or by twice the largest, at most n), without already swept m; None without cells or
    when no new integer m fits."""
    if not cells:
        return None
    cell = sorted(cells, key=lambda c: (-c.width_log, c.regime, c.n))[0]
    seeds_log = (math.log(cell.upper / cell.lower) if cell.lower > 0
                 and math.isfinite(cell.upper) else math.inf)
    cause = ("censored" if cell.status != "located" else
             "seed noise" if seeds_log >= math.log(cell.resolution) else "grid step")
    if cause == "grid step" and cell.m_star is not None:
        j = min(max(int(np.searchsorted(cell.ms, cell.m_star, side="left")), 1),
                len(cell.ms) - 1)
        lo, hi = cell.ms[j - 1], cell.ms[j]
    else:
        lo = cell.lower if cell.lower > 0 else max(1.0, cell.ms[0] / 4)
        hi = cell.upper if math.isfinite(cell.upper) else min(2 * cell.ms[-1], float(cell.n))
    grid = np.exp(np.linspace(math.log(lo), math.log(hi), points + 2)[1:-1])
    swept = {round(m) for m in cell.ms}
    ms = tuple(m for m in sorted({round(float(v)) for v in grid} - swept)
               if 1 <= m <= cell.n and lo < m < hi)
    if not ms:
        return None
    seeds = tuple(sorted({s for c in cells for s in c.seeds}))
    return RefinePlan(cell.regime, cell.n, cell.width_log, cause, ms, seeds)
