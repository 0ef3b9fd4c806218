"""The two curves :mod:`crl.experiments.negatives.curves` reads m* from, and the test that
picks one (docs/negatives.md, "m* from fitted curves"; docs/theory.md §5 and §7).

Scores are oriented so that higher is better. Against ``m`` (ascending, ``(M,)``):

- :class:`Isotonic`: the weighted least-squares non-decreasing fit (pool-adjacent-violators),
  read between swept m by linear interpolation in ``log m``. It assumes nothing but that more
  negatives do not hurt; a curve that dips (shared sets at small m) is pooled into a flat
  stretch.
- :class:`Saturating`: ``plateau - gap * (m / m_1)^-beta`` with ``gap >= 0``, ``beta > 0``:
  the inner-error rates of docs/theory.md §5 (``beta`` near 1 for independent sets, 1/2 for a
  shared set) added to a level that ``m`` does not move.

:func:`lack_of_fit` tests the saturating form against the per-m means (a saturated model) with
the seeds' own scatter as pure error: ``F = (LOF / (M - 3)) / sigma^2`` on ``(M - 3, df)``
degrees of freedom, ``LOF = sum_m w_m (mean_m - f(m))^2`` (``w_m`` seeds at m), ``sigma^2``
the residual variance of the additive model ``score[s, m] = mu_m + b_s + noise`` with ``df =
runs - M - S + 1`` (the classical lack-of-fit F test; Draper and Smith, *Applied Regression
Analysis*, §2.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import optimize
from scipy import stats as sps

FloatArray = NDArray[np.float64]
#: Candidate exponents of the saturating form, refined by a bounded scalar search.
BETAS = np.geomspace(0.02, 8.0, 160)


def pava(values: FloatArray, weights: FloatArray) -> FloatArray:
    """Weighted least-squares non-decreasing fit of ``values`` ``(M,)`` (pool adjacent
    violators).

    Example:
        >>> pava(np.array([1.0, 3.0, 2.0, 4.0]), np.ones(4)).tolist()
        [1.0, 2.5, 2.5, 4.0]
    """
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values.tolist(), weights.tolist(), strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (v2, w2, c2), (v1, w1, c1) = blocks.pop(), blocks.pop()
            total = w1 + w2
            blocks.append([(v1 * w1 + v2 * w2) / total, total, c1 + c2])
    return np.array([b[0] for b in blocks for _ in range(int(b[2]))], dtype=np.float64)


@dataclass(frozen=True)
class Isotonic:
    """The non-decreasing fit at the swept ``ms`` ``(M,)``, linear in ``log m`` between them."""

    ms: tuple[float, ...]
    fitted: tuple[float, ...]

    def at(self, m: float) -> float:
        """The fitted value at ``m`` (held constant outside the swept range)."""
        return float(np.interp(math.log(m), np.log(self.ms), self.fitted))

    def first_reaching(self, level: float) -> float:
        """The smallest swept-range ``m`` where the fit reaches ``level`` (at most its top)."""
        f = np.asarray(self.fitted)
        j = int(np.argmax(f >= level))
        if j == 0:
            return self.ms[0]
        x0, x1 = math.log(self.ms[j - 1]), math.log(self.ms[j])
        return math.exp(x0 + (level - f[j - 1]) / (f[j] - f[j - 1]) * (x1 - x0))

    def rising_at_top(self) -> bool:
        """Whether the fit still rises over its last swept step."""
        return len(self.fitted) > 1 and self.fitted[-1] > self.fitted[-2]


@dataclass(frozen=True)
class Saturating:
    """``plateau - gap * (m / m_first)^-beta``: ``gap`` is the shortfall at ``m_first``."""

    plateau: float
    gap: float
    beta: float
    m_first: float

    def at(self, m: float) -> float:
        """The curve at ``m``."""
        return float(self.plateau - self.gap * (m / self.m_first) ** -self.beta)

    def first_reaching(self, level: float) -> float:
        """The smallest ``m >= m_first`` where the curve reaches ``level`` (inf if never)."""
        if level <= self.at(self.m_first):
            return self.m_first
        if level >= self.plateau:
            return math.inf
        return float(self.m_first * (self.gap / (self.plateau - level)) ** (1 / self.beta))


Curve = Isotonic | Saturating


def isotonic(ms: FloatArray, means: FloatArray, weights: FloatArray) -> Isotonic:
    """:class:`Isotonic` of ``means`` ``(M,)`` at ``ms`` ``(M,)`` with ``weights`` ``(M,)``."""
    return Isotonic(tuple(float(m) for m in ms), tuple(pava(means, weights).tolist()))


def _linear(z: FloatArray, y: FloatArray, w: FloatArray) -> tuple[float, float, float]:
    """Weighted LS of ``y = plateau - gap * z`` with ``gap >= 0``: (plateau, gap, rss)."""
    zw, yw = np.average(z, weights=w), np.average(y, weights=w)
    szz = float(np.sum(w * (z - zw) ** 2))
    gap = -float(np.sum(w * (z - zw) * (y - yw))) / szz if szz > 0 else 0.0
    gap = max(gap, 0.0)
    plateau = float(yw + gap * zw)
    rss = float(np.sum(w * (y - plateau + gap * z) ** 2))
    return plateau, gap, rss


def saturating(ms: FloatArray, means: FloatArray, weights: FloatArray) -> Saturating | None:
    """The weighted least-squares :class:`Saturating` fit, profiled over ``beta`` (a log grid,
    then a bounded search between its neighbours); None with fewer than 3 swept m.

    Example:
        >>> ms = np.array([10.0, 20, 40, 80, 160])
        >>> fit = saturating(ms, 0.5 - 0.2 * (ms / 10) ** -0.7, np.ones(5))
        >>> round(fit.plateau, 6), round(fit.gap, 6), round(fit.beta, 4)
        (0.5, 0.2, 0.7)
    """
    if len(ms) < 3:
        return None
    ratio = ms / ms[0]

    def rss(beta: float) -> float:
        return _linear(ratio ** -beta, means, weights)[2]

    # The grid at once: weighted LS of y = plateau - gap z per row of Z (len(BETAS), M).
    z = ratio[None, :] ** -BETAS[:, None]
    w = weights / weights.sum()
    zc = z - (z @ w)[:, None]
    yc = means - float(means @ w)
    gaps = np.maximum(-(zc * yc) @ w / np.maximum((zc ** 2) @ w, 1e-300), 0.0)
    values = ((yc[None, :] + gaps[:, None] * zc) ** 2) @ weights
    k = int(np.argmin(values))
    lo, hi = BETAS[max(k - 1, 0)], BETAS[min(k + 1, len(BETAS) - 1)]
    found = optimize.minimize_scalar(rss, bounds=(lo, hi), method="bounded",
                                     options={"xatol": 1e-8})
    beta = float(found.x) if found.fun <= rss(float(BETAS[k])) else float(BETAS[k])
    plateau, gap, _ = _linear(ratio ** -beta, means, weights)
    return Saturating(plateau, gap, beta, float(ms[0]))


def pure_error(table: FloatArray, means: FloatArray) -> tuple[float, int]:
    """``(sigma^2, df)`` of the additive model ``table[s, m] = means[m] + b_s + noise``
    (``table`` ``(S, M)``, NaN for missing runs); ``(nan, 0)`` without residual degrees of
    freedom."""
    seen = np.isfinite(table)
    b = np.nanmean(np.where(seen, table - means[None, :], np.nan), axis=1)
    resid = np.where(seen, table - means[None, :] - b[:, None], 0.0)
    df = int(seen.sum()) - table.shape[1] - table.shape[0] + 1
    if df < 1:
        return math.nan, 0
    return float(np.sum(resid ** 2)) / df, df


@dataclass(frozen=True)
class LackOfFit:
    """The F test of a 3-parameter curve against the per-m means (see the module docstring).

    Attributes:
        p_value: P(F >= observed) under the curve; None when not testable.
        f_stat, df_curve, df_error: The statistic and its degrees of freedom.
        reason: Why not testable, else empty.
    """

    p_value: float | None
    f_stat: float
    df_curve: int
    df_error: int
    reason: str = ""


def lack_of_fit(table: FloatArray, means: FloatArray, ms: FloatArray,
                curve: Saturating) -> LackOfFit:
    """The lack-of-fit test of ``curve`` on ``table`` ``(S, M)`` with per-m ``means`` ``(M,)``
    at ``ms`` ``(M,)``."""
    df_curve = len(ms) - 3
    sigma2, df_error = pure_error(table, means)
    if df_curve < 1 or df_error < 1:
        return LackOfFit(None, math.nan, df_curve, df_error,
                         f"not testable: {len(ms)} swept m (need 4) and {df_error} residual "
                         "degrees of freedom among the seeds (need 1)")
    w = np.isfinite(table).sum(axis=0).astype(np.float64)
    fitted = np.array([curve.at(float(m)) for m in ms])
    lof = float(np.sum(w * (means - fitted) ** 2))
    scale = max(1.0, float(np.sum(w * means ** 2)))
    if sigma2 <= 1e-24 * scale:  # noiseless seeds (up to rounding): exact or not at all
        exact = lof <= 1e-12 * scale
        return LackOfFit(1.0 if exact else 0.0, 0.0 if exact else math.inf, df_curve, df_error)
    f_stat = (lof / df_curve) / sigma2
    return LackOfFit(float(sps.f.sf(f_stat, df_curve, df_error)), f_stat, df_curve, df_error)
