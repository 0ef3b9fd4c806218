"""The statistics of ``crl study negatives``: m* per (regime, n) on the swept grid, paired by
seed, with censoring, and the law m*(n) = e^c n^alpha per regime (docs/negatives.md).

Runs that share a seed share the initialisation and the data order across m, so differences
between values of m are estimated within seed: the metric of seed s at m is modelled as
``mu_m + b_s + noise`` (an additive seed effect), and intervals resample whole seeds.

Per cell, ``m*`` is the smallest swept m whose mean is within ``tolerance`` of the best swept m.
The true m* then lies above the largest swept m below it, so the interval of a located cell
runs from the swept m just below the bootstrap's 2.5% quantile to its 97.5% quantile. A cell is
censored when the sweep cannot bound m*: ``above`` when gains are still rising into the largest
swept m (or the best m is the largest and larger m were possible), so ``m* >= X``; ``below``
when the smallest swept m is already within tolerance of the best (more negatives made no
difference larger than the tolerance), so ``m* <= X``. Not-saturated cells enter the fit of
alpha as lower bounds (a squared hinge), never as points; cells saturated at the smallest m are
left out of it (and the report says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from crl.errors import CrlValueError

FloatArray = NDArray[np.float64]
REGIMES = ("shared", "independent")
#: The width (upper / lower end) at which an m* interval counts as informative.
GOOD_WIDTH = 2.5


@dataclass(frozen=True)
class CellEstimate:
    """m* of one (regime, n) cell.

    Attributes:
        regime, n: The cell.
        ms: Swept m, ascending. seeds: Seeds with at least one run.
        means: Seed-adjusted mean metric per m (metric units). sds: Seed-to-seed standard
            deviation of the paired differences to the best m, per m.
        best_m, m_star: The best swept m and the grid m*.
        gain: The best mean minus the mean at the smallest m, in score units (>= 0).
        status: ``located``, ``above`` (not saturated: m* >= lower) or ``below`` (m* <= upper).
        lower, upper: The m* interval (for censored cells the one bound that is known; the other
            is 0 or inf).
        draws: Bootstrap draws of m* (over seeds); draw_status: their statuses.
    """

    regime: str
    n: int
    ms: tuple[int, ...]
    seeds: tuple[int, ...]
    means: tuple[float, ...]
    sds: tuple[float, ...]
    best_m: int
    m_star: int
    gain: float
    status: str
    lower: float
    upper: float
    draws: tuple[int, ...] = field(repr=False)
    draw_status: tuple[str, ...] = field(repr=False)

    @property
    def width(self) -> float:
        """upper / lower (inf when censored or when the lower end is 0)."""
        if self.status != "located" or self.lower <= 0:
            return math.inf
        return self.upper / self.lower

    @property
    def informative(self) -> bool:
        """Located with an interval no wider than :data:`GOOD_WIDTH`, or honestly censored."""
        return self.status != "located" or self.width <= GOOD_WIDTH

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (without the draws)."""
        return {"regime": self.regime, "n": self.n, "ms": list(self.ms),
                "seeds": list(self.seeds), "means": list(self.means), "sds": list(self.sds),
                "best_m": self.best_m, "m_star": self.m_star, "m_star_over_n": self.m_star / self.n,
                "gain": self.gain, "status": self.status,
                "interval": [self.lower, self.upper if math.isfinite(self.upper) else None],
                "width": self.width if math.isfinite(self.width) else None}


def score_table(rows: list[dict[str, Any]], metric: str, higher: bool
                ) -> dict[tuple[str, int], dict[tuple[int, int], float]]:
    """Per (regime, n): ``{(seed, m): score}`` with scores oriented so that higher is better."""
    cells: dict[tuple[str, int], dict[tuple[int, int], float]] = {}
    for r in rows:
        value = r.get(metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            continue
        key = (str(r["regime"]), int(r["n"]))
        cells.setdefault(key, {})[(int(r["seed"]), int(r["m"]))] = \
            float(value) if higher else -float(value)
    return cells


def additive_means(table: FloatArray) -> FloatArray:
    """Least-squares ``mu_m`` of ``table[s, m] = mu_m + b_s + noise`` with NaN for missing runs
    (``(S, M) -> (M,)``); equal to the column means when no run is missing.

    Example:
        >>> t = np.array([[1.0, 2.0], [3.0, np.nan]])  # seed 1: 2 better, its 2nd m missing
        >>> additive_means(t).round(6).tolist()  # on the level of seed 0, which ran at every m
        [1.0, 2.0]
    """
    seen = np.isfinite(table)
    if seen.all():
        return np.asarray(table.mean(axis=0), dtype=np.float64)
    b = np.zeros(table.shape[0])
    mu = np.zeros(table.shape[1])
    for _ in range(1000):
        mu_new = np.nanmean(np.where(seen, table - b[:, None], np.nan), axis=0)
        b_new = np.nanmean(np.where(seen, table - mu_new[None, :], np.nan), axis=1)
        b_new -= b_new.mean()
        done = max(np.abs(mu_new - mu).max(), np.abs(b_new - b).max()) < 1e-13
        mu, b = mu_new, b_new
        if done:
            break
    # Report on the level of the seeds that ran at every m (the plain mean when all did).
    full = seen.all(axis=1)
    offset = float(b[full].mean()) if full.any() else 0.0
    return np.asarray(mu + offset, dtype=np.float64)


def _point(means: FloatArray, ms: tuple[int, ...], tolerance: float) -> tuple[int, int]:
    """(index of the grid m*, index of the best m) of seed-adjusted means ``(M,)``."""
    best = int(np.nanargmax(means))
    within = np.flatnonzero(means >= means[best] - tolerance)
    return int(within.min()), best


def _status(star: int, best: int, ms: tuple[int, ...], n: int) -> str:
    top = len(ms) - 1
    if top > 0 and (star == top or (best == top and ms[top] < n - 1)):
        return "above"
    if star == 0:
        return "below"
    return "located"


def estimate_cell(regime: str, n: int, runs: dict[tuple[int, int], float], tolerance: float, *,
                  num_bootstrap: int, rng: np.random.Generator) -> CellEstimate:
    """m* of one cell from its runs ``{(seed, m): score}`` (see the module docstring)."""
    ms = tuple(sorted({m for _, m in runs}))
    seeds = tuple(sorted({s for s, _ in runs}))
    table = np.full((len(seeds), len(ms)), np.nan)
    for (s, m), v in runs.items():
        table[seeds.index(s), ms.index(m)] = v
    means = additive_means(table)
    star, best = _point(means, ms, tolerance)
    diffs = table - table[:, [best]]
    sds = [float(np.nanstd(diffs[:, j], ddof=1)) if np.isfinite(diffs[:, j]).sum() > 1 else 0.0
           for j in range(len(ms))]
    draws, statuses = [], []
    for _ in range(num_bootstrap):
        pick = rng.integers(0, len(seeds), size=len(seeds))
        sample = table[pick]
        if not np.isfinite(sample).any(axis=0).all():
            sample = table  # a draw that lost an m entirely keeps the data as it is
        s_star, s_best = _point(additive_means(sample), ms, tolerance)
        draws.append(ms[s_star])
        statuses.append(_status(s_star, s_best, ms, n))
    status = _status(star, best, ms, n)
    if status == "above":
        lower, upper = float(ms[star]), math.inf
    elif status == "below":
        lower, upper = 0.0, float(ms[0])
    else:
        lo = float(np.quantile(draws, 0.025, method="lower"))
        hi = float(np.quantile(draws, 0.975, method="higher"))
        lo = min(lo, float(ms[star]))
        hi = max(hi, float(ms[star]))
        below = [m for m in ms if m < lo]
        lower, upper = float(below[-1] if below else lo), hi
    gain = float(means[best] - means[0])
    return CellEstimate(regime, n, ms, seeds, tuple(float(v) for v in means), tuple(sds),
                        ms[best], ms[star], gain, status, lower, upper, tuple(draws),
                        tuple(statuses))


def estimate_cells(rows: list[dict[str, Any]], metric: str, higher: bool, tolerance: float, *,
                   num_bootstrap: int = 400, seed: int = 0) -> list[CellEstimate]:
    """:func:`estimate_cell` for every (regime, n) of ``rows`` with at least 2 swept m.

    Raises:
        CrlValueError: when ``tolerance`` is not a finite number >= 0.
    """
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) \
            or not math.isfinite(tolerance) or tolerance < 0:
        raise CrlValueError(f"estimate_cells: `tolerance` must be a finite number >= 0 (in the "
                            f"metric's units); got {tolerance!r}")
    rng = np.random.default_rng(seed)
    out = []
    for (regime, n), runs in sorted(score_table(rows, metric, higher).items()):
        if len({m for _, m in runs}) >= 2:
            out.append(estimate_cell(regime, n, runs, tolerance, num_bootstrap=num_bootstrap,
                                     rng=rng))
    return out


@dataclass(frozen=True)
class ScalingLaw:
    """``m*(n) = e^c n^alpha`` of one regime, fitted with censored cells as bounds.

    Attributes:
        regime: The regime. alpha, intercept: The fit (NaN when unidentified).
        alpha_ci, intercept_draws: 95% bootstrap interval of alpha, and the bootstrap draws of
            (alpha, c) behind it (for intervals of predictions).
        located, censored: How many cells entered as points and as lower bounds.
        left_out: Cells saturated at the smallest swept m, left out of the fit.
        reason: Empty when identified, else why not.
    """

    regime: str
    alpha: float
    alpha_ci: tuple[float, float]
    intercept: float
    draws: tuple[tuple[float, float], ...] = field(repr=False)
    located: int
    censored: int
    reason: str
    left_out: int = 0

    def predict(self, n: float) -> tuple[float, float, float]:
        """m*(n) and its 95% interval from the bootstrap draws."""
        if not math.isfinite(self.alpha):
            return (math.nan, math.nan, math.nan)
        point = math.exp(self.intercept + self.alpha * math.log(n))
        values = [math.exp(c + a * math.log(n)) for a, c in self.draws]
        if len(values) < 2:
            return (point, math.nan, math.nan)
        lo, hi = np.quantile(values, [0.025, 0.975])
        return (point, float(min(lo, point)), float(max(hi, point)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (without the draws)."""
        return {"regime": self.regime, "alpha": _finite(self.alpha),
                "alpha_ci": [_finite(v) for v in self.alpha_ci],
                "intercept": _finite(self.intercept), "located": self.located,
                "censored": self.censored, "left_out": self.left_out, "reason": self.reason}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def censored_line(x: FloatArray, y: FloatArray, kind: list[str]) -> tuple[float, float]:
    """``(alpha, c)`` minimising ``sum (y - a x - c)^2`` over points plus ``max(0, y - a x - c)^2``
    over lower bounds (``kind == "above"``: m* >= e^y) and ``max(0, a x + c - y)^2`` over upper
    bounds (``"below"``); NaN without 2 distinct ``x`` among the points.

    Example:
        >>> x = np.log([100.0, 400.0, 1600.0]); y = 0.5 * x
        >>> a, c = censored_line(x, y, ["located", "located", "above"])
        >>> round(a, 6), abs(round(c, 6))
        (0.5, 0.0)
    """
    is_point = np.array([k == "located" for k in kind])
    if len(set(np.round(x[is_point], 12))) < 2:
        return (math.nan, math.nan)
    lower = np.array([k == "above" for k in kind])
    upper = np.array([k == "below" for k in kind])
    # The squared hinge is least squares over the points and the bounds the line violates:
    # refit with the bounds the last line violates as points until that set stops changing
    # (a semismooth Newton method on a convex piecewise quadratic; finite in practice).
    active = np.zeros(len(kind), dtype=bool)
    for _ in range(4 * len(kind) + 1):
        use = is_point | active
        a, c = np.polyfit(x[use], y[use], 1)
        r = y - a * x - c
        now = (lower & (r > 1e-12)) | (upper & (r < -1e-12)) | (active & (np.abs(r) <= 1e-12))
        if np.array_equal(now, active):
            break
        active = now
    return (float(a), float(c))


def _values(cells: list[CellEstimate], draw: int | None) -> tuple[FloatArray, FloatArray,
                                                                  list[str]]:
    """The fit's inputs: the point estimates, or bootstrap draw ``draw``. A located m* is only
    known to lie in the step from the swept m below it to it, so a draw spreads it log-uniformly
    over that step (the alpha interval then carries the grid's coarseness, not only the seeds')
    and the point estimate takes the step's geometric midpoint, the centre of that spread.
    Taking the step's upper end instead would put the point fit above its own bootstrap draws
    (by half a step in log m*)."""
    rng = np.random.default_rng(draw)
    x, y, kind = [], [], []
    for c in cells:
        status = c.status if draw is None else c.draw_status[draw]
        m = float(c.m_star if draw is None else c.draws[draw])
        if status == "below":
            m = float(c.ms[0])
        log_m = math.log(m)
        below = [v for v in c.ms if v < m]
        if status == "located" and below:
            log_m = (rng.uniform(math.log(below[-1]), log_m) if draw is not None
                     else 0.5 * (math.log(below[-1]) + log_m))
        x.append(math.log(c.n))
        y.append(log_m)
        kind.append(status)
    return np.array(x), np.array(y), kind


def fit_law(regime: str, cells: list[CellEstimate]) -> ScalingLaw:
    """The censored fit of ``log m* = alpha log n + c`` over the cells of ``regime``.

    Cells saturated at the smallest swept m (``below``) are left out: there the metric did not
    move with m beyond the tolerance, which says more about the metric (near chance, or the
    budget) than about where gains stop. Not-saturated cells (``above``) enter as lower bounds.
    """
    mine = [c for c in cells if c.regime == regime and c.status != "below"]
    left_out = sum(c.regime == regime and c.status == "below" for c in cells)
    located = sum(c.status == "located" for c in mine)
    censored = len(mine) - located
    nan2 = (math.nan, math.nan)
    if len({c.n for c in mine if c.status == "located"}) < 2:
        return ScalingLaw(regime, math.nan, nan2, math.nan, (), located, censored,
                          f"m* located at {located} value(s) of n (need 2; {censored} not "
                          f"saturated, {left_out} saturated at the smallest m)", left_out)
    alpha, intercept = censored_line(*_values(mine, None))
    draws = []
    for b in range(min(len(c.draws) for c in mine)):
        a, c = censored_line(*_values(mine, b))
        if math.isfinite(a):
            draws.append((a, c))
    if len(draws) >= 20:
        lo, hi = np.quantile([a for a, _ in draws], [0.025, 0.975])
        ci = (float(min(lo, alpha)), float(max(hi, alpha)))
    else:
        ci = nan2
    return ScalingLaw(regime, alpha, ci, intercept, tuple(draws), located, censored, "",
                      left_out)
