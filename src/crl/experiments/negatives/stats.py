"""The shared tables of the negatives statistics (docs/negatives.md, "The statistics"): the
oriented scores per (regime, n) and the seed-adjusted means.

Runs that share a seed share the initialisation and the data order across m, so differences
between values of m are estimated within seed: the metric of seed s at m is modelled as
``mu_m + b_s + noise`` (an additive seed effect), and intervals resample whole seeds
(:mod:`.resample`). m* per cell is read from curves fitted to these means (:mod:`.curves`);
the law m*(n) is :mod:`.laws`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
REGIMES = ("shared", "independent")


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
