"""Resampling whole seeds, exactly when the seeds allow: the intervals of
:mod:`crl.experiments.negatives.curves` (docs/negatives.md, "Paired by seed").

A bootstrap over ``S`` seeds draws ``S`` of them with replacement. Only the multiset of the
draw matters (how many times each seed is taken), and there are ``C(2S - 1, S)`` multisets
(10 for 3 seeds, 462 for 6, 1,716 for 7), multiset ``c`` having the multinomial probability
``S! / (prod_s c_s!) / S^S``. With at most :data:`MAX_EXACT` multisets they are all enumerated
with these weights, so the interval is the bootstrap's exact quantile, not a Monte Carlo
estimate of it; beyond that, :data:`NUM_DRAWS` random draws (weight ``1 / draws`` each).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from numpy.typing import NDArray

#: Enumerate every multiset of seeds when there are at most this many.
MAX_EXACT = 2000
#: Random draws otherwise.
NUM_DRAWS = 2000


def num_multisets(num_seeds: int) -> int:
    """``C(2S - 1, S)``: distinct bootstrap resamples of ``S`` seeds.

    Example:
        >>> [num_multisets(s) for s in (1, 2, 3, 6)]
        [1, 3, 10, 462]
    """
    return math.comb(2 * num_seeds - 1, num_seeds)


def seed_resamples(num_seeds: int, rng: np.random.Generator, *, max_exact: int = MAX_EXACT,
                   num_draws: int = NUM_DRAWS
                   ) -> tuple[NDArray[np.int64], NDArray[np.float64], bool]:
    """The bootstrap's resamples of ``S = num_seeds`` seeds as counts with weights.

    Returns:
        ``(counts, weights, exact)``: ``counts`` ``(R, S)``, how often each seed is drawn (rows
        sum to ``S``); ``weights`` ``(R,)`` summing to 1; ``exact`` whether the rows are every
        multiset with its multinomial probability (else ``num_draws`` random draws).

    Example:
        >>> counts, weights, exact = seed_resamples(2, np.random.default_rng(0))
        >>> counts.tolist(), weights.tolist(), exact
        ([[2, 0], [1, 1], [0, 2]], [0.25, 0.5, 0.25], True)
    """
    if num_seeds < 1:
        raise ValueError(f"seed_resamples: num_seeds must be >= 1; got {num_seeds}")
    if num_multisets(num_seeds) <= max_exact:
        rows = [np.bincount(pick, minlength=num_seeds) for pick in
                itertools.combinations_with_replacement(range(num_seeds), num_seeds)]
        counts = np.array(rows, dtype=np.int64)
        # Multinomial coefficients in integers: S! / prod(c!) of the S^S ordered draws.
        ways = [math.factorial(num_seeds) // math.prod(math.factorial(int(c)) for c in row)
                for row in rows]
        weights = np.array([w / num_seeds ** num_seeds for w in ways])
        return counts, weights, True
    counts = rng.multinomial(num_seeds, np.full(num_seeds, 1 / num_seeds), size=num_draws)
    return counts.astype(np.int64), np.full(num_draws, 1 / num_draws), False


def weighted_quantile(values: NDArray[np.float64], weights: NDArray[np.float64],
                      q: float) -> float:
    """The smallest value whose cumulative weight reaches ``q`` (the inverse of the weighted
    empirical distribution function; values may be +-inf).

    Example:
        >>> weighted_quantile(np.array([3.0, 1.0, 2.0]), np.array([0.5, 0.25, 0.25]), 0.5)
        2.0
    """
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order]) / float(np.sum(weights))
    index = int(np.searchsorted(cum, q - 1e-12, side="left"))
    return float(values[order][min(index, len(values) - 1)])
