"""B* read from the fitted curve of the metric over ``log B``, with exact seed resampling
(docs/batch.md, "The statistics").

The negatives study's curves (:mod:`crl.experiments.negatives.curves`) assume that more
negatives do not hurt. Over B at a fixed sample budget that does not hold: a batch of B takes
``budget / B`` steps, so past some B the fewer steps cost more than the extra negatives gain and
the metric falls. The reading here is therefore taken on the rising part:

- **The best.** ``B_best`` is the swept B with the highest seed-adjusted mean
  (:func:`~crl.experiments.negatives.stats.additive_means`; scores oriented so that higher is
  better). The curve is fitted over the swept B up to ``B_best`` with the negatives study's
  choice of curve (:func:`~crl.experiments.negatives.curves.choose_curve`: the saturating form
  when its lack-of-fit test passes, else the isotonic fit), so its top is the best.
- **B\\*.** The smallest B where that curve comes within the tolerance of its top, read between
  swept B (linear in ``log B`` for the isotonic fit).
- **Censoring.** ``below`` when the smallest swept B is already within the tolerance (``B* <=
  B_1``). ``above`` only when the best is the largest swept B and the curve still rises there:
  B* in the last swept step (``B* > B_{M-1}``, possibly beyond ``B_M``, unless ``B_M`` is the
  whole training split), or the grid stops short of the whole split while the curve still
  rises at its top. No point is given for either.
- **Interval.** Every seed resample (exact enumeration up to 2,000 distinct resamples,
  :mod:`crl.experiments.negatives.resample`) repeats the whole reading, its own ``B_best``
  included; the 95% interval runs from the weighted 2.5% quantile of the readings' lower ends
  to the 97.5% quantile of their upper ends. The grid's resolution (the ratio of the swept B
  around B*) is stated beside it.

The result is a :class:`~crl.experiments.negatives.curves.CurveCell` whose ``ms`` are the swept
B and whose ``n`` is the number of training pairs (the largest possible batch), so the negatives
study's refinement planner (:mod:`crl.experiments.negatives.refine`) serves it unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from crl.experiments.negatives.curvefit import Curve, FloatArray, Isotonic, isotonic, saturating
from crl.experiments.negatives.curves import CurveCell, Reading, choose_curve, seed_spread
from crl.experiments.negatives.stats import additive_means
from crl.experiments.negatives.tolerance import Tolerance

#: The ``regime`` of a batch study's cell: in-batch negatives, one set shared by the batch.
REGIME = "in_batch"


def _columns(table: FloatArray) -> tuple[FloatArray, FloatArray]:
    return additive_means(table), np.isfinite(table).sum(axis=0).astype(np.float64)


def _fit(method: str, bs: FloatArray, means: FloatArray, weights: FloatArray) -> Curve:
    if method == "saturating":
        fit = saturating(bs, means, weights)
        if fit is not None:
            return fit
    return isotonic(bs, means, weights)


def best_index(table: FloatArray) -> int:
    """The column of the highest seed-adjusted mean of ``table`` ``(S, M)`` (the first of
    equals)."""
    return int(np.argmax(additive_means(table)))


def read_b_star(curve: Curve, bs: tuple[float, ...], top_of_grid: bool, n: int,
                tolerance: Tolerance) -> Reading:
    """B* on ``curve``, fitted over the swept ``bs`` ``(K,)`` up to the best (the module
    docstring); ``top_of_grid``: the best is the largest swept B; ``n``: the largest possible
    batch (the training pairs)."""
    top = curve.at(bs[-1])
    level = top - tolerance.points(top)
    if curve.at(bs[0]) >= level:
        return Reading("below", None, 0.0, bs[0])
    b = min(max(curve.first_reaching(level), bs[0]), bs[-1])
    if not top_of_grid:
        return Reading("located", b, b, b)
    reaches_all = bs[-1] >= n
    if b > bs[-2]:
        return Reading("above", None, bs[-2], bs[-1] if reaches_all else math.inf)
    rising = (curve.rising_at_top() if isinstance(curve, Isotonic)
              else curve.at(n) - top > tolerance.points(top))
    if not reaches_all and rising:
        return Reading("above", None, b, math.inf)
    return Reading("located", b, b, b)


def _reading(table: FloatArray, grid: FloatArray, n: int, method: str,
             tolerance: Tolerance) -> Reading:
    """The reading of ``table`` ``(S', M)``; columns without runs are dropped."""
    keep = np.isfinite(table).any(axis=0)
    if keep.sum() < 2:
        return Reading("below", None, 0.0, math.inf)  # nothing to read: no bound
    table, bs = table[:, keep], grid[keep]
    k = best_index(table)
    if k == 0:
        return Reading("below", None, 0.0, float(bs[0]))
    means, weights = _columns(table[:, :k + 1])
    curve = _fit(method, bs[:k + 1], means, weights)
    return read_b_star(curve, tuple(float(b) for b in bs[:k + 1]), k == len(bs) - 1, n,
                       tolerance)


def _resolution(bs: tuple[float, ...], reading: Reading) -> float:
    """The ratio of the swept B around the reading (the grid's own limit)."""
    j = int(np.searchsorted(bs, reading.lower, side="left"))
    if reading.status == "below":
        j = 1
    j = min(max(j, 1), len(bs) - 1)
    return bs[j] / bs[j - 1]


def _reason(reading: Reading, bs: tuple[float, ...]) -> str:
    if reading.status == "below":
        return (f"saturated at the smallest swept B: B* <= {bs[0]:g} (within the tolerance of "
                "the best there)")
    if reading.status == "above":
        top = ("" if math.isinf(reading.upper)
               else f" and <= {reading.upper:g} (the whole training split)")
        return (f"not saturated: the metric still rises at the largest swept B = {bs[-1]:g}: "
                f"B* > {reading.lower:g}{top}; sweep larger B to locate it")
    return ""


def estimate_b_star(n: int, bs: tuple[float, ...], seeds: tuple[int, ...], table: FloatArray,
                    tolerance: Tolerance, *, rng: np.random.Generator,
                    max_exact: int = 2000, num_draws: int = 2000) -> CurveCell:
    """B* of ``table`` ``(S, M)`` (oriented scores, seeds by swept ``bs`` ascending, NaN = no
    run) for ``n`` training pairs, as a :class:`CurveCell` (``ms`` = B, ``m_star`` = B*).

    Raises:
        ValueError: with fewer than 2 swept B.
    """
    if len(bs) < 2:
        raise ValueError(f"estimate_b_star: need >= 2 swept B; got {list(bs)}")
    grid = np.asarray(bs, dtype=np.float64)
    k = best_index(table)
    rising = table[:, :max(k, 1) + 1]
    method, why, test = choose_curve(rising, grid[:rising.shape[1]])
    why = why.replace("swept m", "swept B").replace("with m", "with B")
    means = additive_means(table)
    pooled = _reading(table, grid, n, method, tolerance)
    curve = _fit(method, grid[:rising.shape[1]], *_columns(rising))
    spread = seed_spread(table, seeds, pooled,
                         lambda sub: _reading(sub, grid, n, method, tolerance), rng,
                         max_exact=max_exact, num_draws=num_draws)
    top = float(means[k])
    fitted = tuple(curve.at(b) if j <= k else math.nan for j, b in enumerate(bs))
    return CurveCell(REGIME, n, bs, seeds, tuple(means.tolist()), fitted, method,
                     why + f"; fitted over B <= {bs[k]:g}, the best", test, curve,
                     tolerance.points(top), pooled.status, pooled.m_star, spread.lower,
                     spread.upper, _resolution(bs, pooled), spread.exact,
                     spread.num_resamples, spread.per_seed, _reason(pooled, bs))


def batch_table(rows: list[dict[str, Any]], metric: str, higher: bool
                ) -> tuple[tuple[float, ...], tuple[int, ...], FloatArray]:
    """``(bs, seeds, table (S, M))`` of oriented scores from rows with ``batch_size``,
    ``seed`` and ``metric`` (NaN = no run or an unreadable value)."""
    runs: dict[tuple[int, int], float] = {}
    for r in rows:
        value = r.get(metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            continue
        runs[(int(r["seed"]), int(r["batch_size"]))] = float(value) if higher else -float(value)
    bs = tuple(sorted({b for _, b in runs}))
    seeds = tuple(sorted({s for s, _ in runs}))
    table = np.full((len(seeds), len(bs)), np.nan)
    for (s, b), v in runs.items():
        table[seeds.index(s), bs.index(b)] = v
    return tuple(float(b) for b in bs), seeds, table


def b_star(rows: list[dict[str, Any]], metric: str, higher: bool, tolerance: Tolerance, n: int,
           *, seed: int = 0) -> CurveCell | None:
    """:func:`estimate_b_star` of ``rows`` (None with fewer than 2 swept B); the random draws
    (only beyond 2,000 distinct resamples) depend on ``seed`` alone."""
    bs, seeds, table = batch_table(rows, metric, higher)
    if len(bs) < 2:
        return None
    return estimate_b_star(n, bs, seeds, table, tolerance, rng=np.random.default_rng(seed))
