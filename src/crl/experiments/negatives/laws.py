"""The law ``m*(n) = e^c n^alpha`` per regime, tested before it is used (docs/negatives.md,
"The law"; docs/theory.md §7, "The per-regime prediction").

Each cell of :mod:`.curves` is one observation of ``y = log m*`` at ``x = log n``:

- a located cell with a finite interval: ``y ~ N(c + alpha x, s^2 + tau^2)``, where ``s`` is
  the cell's own uncertainty, ``s^2 = (log(upper / lower) / 3.92)^2 + (log r)^2 / 12`` (its
  95% seed interval as a standard deviation, plus a log-uniform spread over the grid step of
  ratio ``r`` around m*), and ``tau`` the scatter *across* cells that the law leaves;
- a censored cell (or a located one whose interval is open): the probability that ``y``
  falls in its bounds ``(log lower, log upper)`` (``-inf`` / ``+inf`` where open) under the
  same Gaussian with ``s`` the grid term alone: an interval-censored likelihood.

``(alpha, c, tau)`` maximise the likelihood (``tau >= 0``), found by Newton's method with the
analytic Hessian in ``(alpha, c, tau^2)`` from two starting scatters (:func:`_newton`; scipy's
BFGS where it does not converge). **Lack of fit**: the law with
``tau = 0`` against a saturated model (each cell its own ``y``): ``G = sum_located (r_i /
s_i)^2 - 2 sum_censored log P(bounds)``, chi-square with ``k - 2`` degrees of freedom for
``k`` cells; the law *fits* when ``p >= 0.05``, and is untested with 2 cells (a line always
passes through 2). **Intervals** for alpha and for the law's value at a target n are profile-
likelihood intervals with ``tau`` profiled out, at the small-sample threshold ``k log(1 +
F_{1, k-2; 0.95} / (k - 2))`` (the exact t interval of a straight line with unknown variance,
written as a likelihood ratio), so the scatter across cells widens them. A prediction for a
cell at the target adds ``1.96 tau`` in quadrature.

**Recommendation**: when the law fits, its prediction at the target n (flagged as an
extrapolation outside the swept n); when it does not, or is untested, the measured cell nearest
the target in ``log n``, never an extrapolated point. **Backtest**: the largest n left out and
predicted from the rest (:mod:`.backtest`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, special
from scipy import stats as sps

from crl.experiments.negatives.curves import CurveCell

#: The law fits when its lack-of-fit p-value is at least this.
FIT_P = 0.05
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Observation:
    """One cell in the fit: ``x = log n``; located: ``y = log m*`` with sd ``s``; censored:
    ``y`` in ``(low, high)`` (log bounds) with sd ``s`` (the grid term)."""

    n: int
    located: bool
    y: float
    s: float
    low: float
    high: float


def finite(value: float | None) -> float | None:
    """``value`` for JSON: None where it is None, infinite or NaN."""
    return value if value is not None and math.isfinite(value) else None


def observation(cell: CurveCell) -> Observation:
    """The :class:`Observation` of ``cell`` (see the module docstring)."""
    grid = math.log(cell.resolution) / math.sqrt(12)
    if cell.m_star is not None and cell.lower > 0 and math.isfinite(cell.upper):
        seeds = math.log(cell.upper / cell.lower) / (2 * Z95)
        y = math.log(cell.m_star)
        return Observation(cell.n, True, y, math.hypot(seeds, grid), y, y)
    low = math.log(cell.lower) if cell.lower > 0 else -math.inf
    high = math.log(cell.upper) if math.isfinite(cell.upper) else math.inf
    return Observation(cell.n, False, math.nan, grid, low, high)


def _log_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``log(Phi(b) - Phi(a))`` for ``a < b`` (arrays; ``-inf``/``inf`` allowed), stably."""
    flip = a > 0  # in the upper tail use the symmetry Phi(b) - Phi(a) = Phi(-a) - Phi(-b)
    hi = np.where(flip, -a, b)
    lo = np.where(flip, -b, a)
    lh, ll = special.log_ndtr(hi), special.log_ndtr(lo)
    return np.asarray(lh + np.log1p(-np.exp(np.minimum(ll - lh, 0.0))))


def _density_over(z: np.ndarray, log_p: np.ndarray) -> np.ndarray:
    """``phi(z) / P`` from ``log P`` (0 where ``z`` is infinite)."""
    finite = np.isfinite(z)
    exponent = np.where(finite, -0.5 * np.where(finite, z, 0.0) ** 2
                        - 0.5 * math.log(2 * math.pi) - log_p, -np.inf)
    return np.asarray(np.exp(np.minimum(exponent, 700.0)))


Arrays = tuple[np.ndarray, ...]


def _arrays(obs: Sequence[Observation]) -> Arrays:
    """``(x, s, located, y, low, high)`` of ``obs``, each ``(k,)``."""
    return (np.log([o.n for o in obs]), np.array([o.s for o in obs]),
            np.array([o.located for o in obs]), np.array([o.y for o in obs]),
            np.array([o.low for o in obs]), np.array([o.high for o in obs]))


def _log_lik_grad(obs: Sequence[Observation], alpha: float, c: float,
                  tau: float) -> tuple[float, float, float, float]:
    """The log-likelihood and its gradient in ``(alpha, c, tau)``."""
    return _lik_grad(_arrays(obs), alpha, c, tau)


def _lik_grad(arrays: Arrays, alpha: float, c: float,
              tau: float) -> tuple[float, float, float, float]:
    """:func:`_log_lik_grad` of the observations' :func:`_arrays` (made once by an
    optimisation that asks many times): the first derivatives of :func:`_curvatures`, chained
    through ``mu = c + alpha x`` and ``sd = sqrt(s^2 + tau^2)``."""
    total, d1, _, x, sd = _curvatures(arrays, alpha, c, tau, None)
    d_mu, d_sd = d1
    return total, float((d_mu * x).sum()), float(d_mu.sum()), float((d_sd * tau / sd).sum())


def log_likelihood(obs: list[Observation], alpha: float, c: float, tau: float) -> float:
    """The log-likelihood of the law ``log m* = c + alpha log n`` with residual scale ``tau``
    (module docstring)."""
    return _log_lik_grad(obs, alpha, c, tau)[0]


def _maximise(obs: Sequence[Observation], fixed: dict[str, float]
              ) -> tuple[float, dict[str, float]]:
    """Maximise over the parameters not in ``fixed`` (``alpha``, ``c``, ``tau``; a fixed
    ``y_at`` with ``x_at`` ties ``c = y_at - alpha x_at``): (max log-likelihood, parameters).

    A deterministic function of its arguments, so each distinct call is made once per process
    (a profile interval's bracket ends are asked again by its root search, and the tolerance
    sensitivity and backtests refit cells they share)."""
    top, params = _maximised(tuple(obs), tuple(sorted(fixed.items())))
    return top, dict(params)


#: Newton's iterations stop when every gradient component is at most this (scipy's BFGS
#: ``gtol`` before it: the same optimum), or after :data:`NEWTON_MAX_ITER` iterations.
NEWTON_GTOL = 1e-8
NEWTON_MAX_ITER = 100
#: The longest Newton step (Euclidean, in ``(alpha, c, w = tau^2)``): far from the maximum the
#: quadratic model is not trusted further.
NEWTON_MAX_STEP = 1.0


def _curvatures(arrays: Arrays, alpha: float, c: float, tau: float, x_at: float | None
                ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The log-likelihood, its derivatives in each cell's ``(mu, sd)`` and the chain factors.

    Returns ``(value, d1, d2, j_mu_alpha, sd)``: ``d1 (2, k)`` the first derivatives in ``mu``
    and ``sd``, ``d2 (3, k)`` the second ones (``mu mu``, ``mu sd``, ``sd sd``), ``j_mu_alpha
    (k,)`` ``d mu / d alpha`` (``x``, or ``x - x_at`` when ``c`` is tied to a fixed value at
    ``x_at``) and ``sd (k,)``. Located cells: ``l = -log sd - z^2 / 2`` (``z = (y - mu) / sd``);
    censored: ``l = log(Phi(b) - Phi(a))`` with ``a, b`` the standardised bounds, whose
    derivatives are moments of the densities at the bounds over ``P`` (0 at an open bound).
    """
    x, s, loc, y, low, high = arrays
    k = len(x)
    mu = c + alpha * x
    sd = np.sqrt(s ** 2 + tau ** 2)
    d1 = np.zeros((2, k))
    d2 = np.zeros((3, k))
    sd_loc = sd[loc]
    z = (y[loc] - mu[loc]) / sd_loc
    total = float((-0.5 * np.log(2 * math.pi * sd_loc ** 2) - 0.5 * z ** 2).sum())
    d1[0, loc], d1[1, loc] = z / sd_loc, (z ** 2 - 1) / sd_loc
    inv2 = 1.0 / sd_loc ** 2
    d2[0, loc], d2[1, loc], d2[2, loc] = -inv2, -2 * z * inv2, (1 - 3 * z ** 2) * inv2
    cen = ~loc
    if cen.any():
        sd_c = sd[cen]
        a, b = (low[cen] - mu[cen]) / sd_c, (high[cen] - mu[cen]) / sd_c
        log_p = _log_between(a, b)
        total += float(log_p.sum())
        pa, pb = _density_over(a, log_p), _density_over(b, log_p)
        za = np.where(np.isfinite(a), a, 0.0)
        zb = np.where(np.isfinite(b), b, 0.0)
        m0, m1 = pa - pb, za * pa - zb * pb  # the first two moments at the bounds
        m2, m3 = za ** 2 * pa - zb ** 2 * pb, za ** 3 * pa - zb ** 3 * pb
        l_mu, l_sd = m0 / sd_c, m1 / sd_c
        d1[0, cen], d1[1, cen] = l_mu, l_sd
        inv2 = 1.0 / sd_c ** 2
        d2[0, cen] = m1 * inv2 - l_mu ** 2
        d2[1, cen] = (m2 - m0) * inv2 - l_mu * l_sd
        d2[2, cen] = (m3 - 2 * m1) * inv2 - l_sd ** 2
    return total, d1, d2, (x if x_at is None else x - x_at), sd


def _objective(names: Sequence[str], fixed: dict[str, float], arrays: Arrays, v: np.ndarray
               ) -> tuple[float, np.ndarray, np.ndarray]:
    """The log-likelihood at ``v`` (values of ``names``: a subset of ``alpha``, ``c`` and the
    scatter's variance ``w = tau^2 >= 0``; the others from ``fixed``, where ``y_at`` with
    ``x_at`` ties ``c = y_at - alpha x_at``), its gradient ``(p,)`` and Hessian ``(p, p)``, by
    the chain rule through each cell's ``mu = c + alpha x`` and ``sd = sqrt(s^2 + w)``
    (:func:`_curvatures`)."""
    p = dict(zip(names, v.tolist(), strict=True))
    tau = math.sqrt(max(p["w"], 0.0)) if "w" in p else fixed.get("tau", 0.0)
    alpha = p.get("alpha", fixed.get("alpha", 0.0))
    tied = "y_at" in fixed
    c = fixed["y_at"] - alpha * fixed.get("x_at", 0.0) if tied else p.get("c", fixed.get("c", 0.0))
    value, d1, d2, j_alpha, sd = _curvatures(arrays, alpha, c, tau,
                                             fixed.get("x_at", 0.0) if tied else None)
    k = len(sd)
    j_mu = np.zeros((len(names), k))
    j_sd = np.zeros((len(names), k))
    curl = np.zeros(len(names))  # dl/dsd times d^2 sd / dw^2 (w only)
    for i, name in enumerate(names):
        if name == "alpha":
            j_mu[i] = j_alpha
        elif name == "c":
            j_mu[i] = 1.0
        else:
            j_sd[i] = 0.5 / sd
            curl[i] = float((d1[1] * (-0.25 / sd ** 3)).sum())
    grad = j_mu @ d1[0] + j_sd @ d1[1]
    cross = (j_mu * d2[1]) @ j_sd.T
    hess = (j_mu * d2[0]) @ j_mu.T + cross + cross.T + (j_sd * d2[2]) @ j_sd.T + np.diag(curl)
    return value, grad, hess


def _newton(names: list[str], fixed: dict[str, float], arrays: Arrays, v0: np.ndarray
            ) -> tuple[float, np.ndarray] | None:
    """Maximise the log-likelihood over ``names`` (:func:`_objective`) from ``v0``: Newton's
    method with the analytic Hessian, projected onto ``w >= 0`` (at ``w = 0`` with the
    gradient pointing below it, ``w`` stays 0 and the others move), the Hessian's eigenvalues
    taken by absolute value and floored (every step ascends), steps at most
    :data:`NEWTON_MAX_STEP` long and a backtracking line search. Returns ``(max
    log-likelihood, argmax)``, or None when the projected gradient is not within
    :data:`NEWTON_GTOL` after :data:`NEWTON_MAX_ITER` iterations (the caller then falls back
    to BFGS)."""
    var = names.index("w") if "w" in names else None
    v = v0.astype(float)
    value, grad, hess = _objective(names, fixed, arrays, v)
    for _ in range(NEWTON_MAX_ITER):
        if not math.isfinite(value) or not np.all(np.isfinite(grad)) \
                or not np.all(np.isfinite(hess)):
            return None
        free = np.ones(len(names), dtype=bool)
        if var is not None and v[var] <= 0.0 and grad[var] <= 0.0:
            free[var] = False  # on the bound, pushed against it
        if float(np.abs(grad[free]).max(initial=0.0)) <= NEWTON_GTOL:
            return value, v
        eig, vecs = np.linalg.eigh(-hess[np.ix_(free, free)])
        scale = np.maximum(np.abs(eig), max(1e-6 * float(np.abs(eig).max(initial=0.0)), 1e-8))
        step = np.zeros(len(names))
        step[free] = vecs @ ((vecs.T @ grad[free]) / scale)
        norm = float(np.linalg.norm(step))
        if norm > NEWTON_MAX_STEP:
            step *= NEWTON_MAX_STEP / norm
        noise = 64 * np.finfo(float).eps * max(1.0, abs(value))  # rounding of the value
        if float(grad @ step) <= noise:  # the model promises nothing the value can show
            return value, v
        for _ in range(60):
            trial = v + step
            if var is not None:
                trial[var] = max(trial[var], 0.0)
            new = _objective(names, fixed, arrays, trial)
            if math.isfinite(new[0]) \
                    and new[0] >= value + 1e-4 * float(grad @ (trial - v)) - noise:
                break
            step = step / 2
        else:
            return None
        v, (value, grad, hess) = trial, new
    return None


@functools.lru_cache(maxsize=4096)
def _maximised(obs: tuple[Observation, ...], fixed_items: tuple[tuple[str, float], ...]
               ) -> tuple[float, dict[str, float]]:
    fixed = dict(fixed_items)
    names = [k for k in ("alpha", "c", "tau") if k not in fixed
             and not (k == "c" and "y_at" in fixed)]
    arrays = _arrays(obs)
    loc = [o for o in obs if o.located]
    x = np.log([o.n for o in loc])
    a0, c0 = (np.polyfit(x, [o.y for o in loc], 1) if len(set(x.tolist())) >= 2
              else (0.5, float(np.mean([o.y for o in loc])) if loc else 0.0))
    x_at = fixed.get("x_at", 0.0)

    def params(v: np.ndarray) -> dict[str, float]:
        p = dict(fixed) | dict(zip(names, v.tolist(), strict=True))
        if "tau" in names:
            p["tau"] = p["tau"] ** 2  # tau = t^2 >= 0, unconstrained in t
        if "y_at" in fixed:
            p["c"] = fixed["y_at"] - p["alpha"] * x_at
        return p

    def nll(v: np.ndarray) -> tuple[float, np.ndarray]:
        p = params(v)
        value, g_alpha, g_c, g_tau = _lik_grad(arrays, p["alpha"], p["c"], p["tau"])
        if "y_at" in fixed:
            g_alpha -= g_c * x_at  # c moves with alpha
        t = v[names.index("tau")] if "tau" in names else 0.0
        grads = {"alpha": g_alpha, "c": g_c, "tau": g_tau * 2 * t}
        return -value, -np.array([grads[k] for k in names])

    newton_names = ["w" if k == "tau" else k for k in names]
    best: tuple[float, dict[str, float]] = (-math.inf, {})
    start = {"alpha": float(a0), "c": float(c0)}
    for tau0 in (0.05, 0.5):
        v0 = np.array([start.get(k, math.sqrt(tau0)) for k in names])
        w0 = np.array([tau0 ** 2 if k == "tau" else v0[i] for i, k in enumerate(names)])
        found = _newton(newton_names, fixed, arrays, w0)
        if found is not None:  # back to t = sqrt(tau) for params()
            top, v = found[0], np.array([math.sqrt(math.sqrt(x)) if k == "tau" else x
                                         for k, x in zip(names, found[1], strict=True)])
        else:  # not converged: the quasi-Newton search in (alpha, c, t) from the same start
            res = optimize.minimize(nll, v0, jac=True, method="BFGS", options={"gtol": 1e-8})
            top, v = -float(res.fun), res.x
        if np.isfinite(top) and top > best[0]:
            best = (float(top), params(v))
    return best


def _threshold(k: int) -> float:
    """The profile-likelihood drop of a 95% interval with ``k`` cells (module docstring); inf
    with 2 cells or fewer, where a line and its scale leave no degree of freedom (the F
    quantile is undefined) and no interval closes."""
    if k <= 2:
        return math.inf
    return k * math.log1p(sps.f.ppf(0.95, 1, k - 2) / (k - 2))


def _profile(obs: list[Observation], key: str, centre: float, top: float, thr: float,
             extra: dict[str, float], step: float) -> tuple[float, float]:
    """The 95% profile interval of ``key`` around ``centre`` (inf where it does not close)."""
    if not math.isfinite(thr):
        return -math.inf, math.inf

    def drop(v: float) -> float:
        return 2 * (top - _maximise(obs, extra | {key: v})[0]) - thr

    ends = []
    for sign in (-1.0, 1.0):
        inner, width = centre, step
        while width < 256 * step and drop(centre + sign * width) < 0:
            inner, width = centre + sign * width, 2 * width
        if width >= 256 * step:
            ends.append(sign * math.inf)
            continue
        a, b = sorted((inner, centre + sign * width))
        ends.append(optimize.brentq(drop, a, b, xtol=1e-4))
    return ends[0], ends[1]


@dataclass(frozen=True)
class LawFit:
    """The law of one regime (see the module docstring).

    Attributes:
        regime: The regime. with_censored: Whether censored cells entered.
        alpha, intercept, tau: The maximum-likelihood law (None when not identified).
        alpha_ci: Its 95% profile interval (None when not identified; ends may be inf).
        residuals: Per cell ``(n, standardised residual)``; a censored cell's is its distance
            outside its bounds (0 inside).
        statistic, df, p_value: The lack-of-fit test (p None when untested).
        verdict: ``fits``, ``does not fit`` or ``untested``. reason: Why, in words.
        observations: The fit's inputs (for :meth:`predict`).
    """

    regime: str
    with_censored: bool
    alpha: float | None
    intercept: float | None
    tau: float | None
    alpha_ci: tuple[float, float] | None
    residuals: tuple[tuple[int, float], ...]
    statistic: float
    df: int
    p_value: float | None
    verdict: str
    reason: str
    observations: tuple[Observation, ...] = field(repr=False)
    log_lik: float = field(default=math.nan, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (open interval ends and untested values are None)."""
        return {"regime": self.regime, "with_censored": self.with_censored,
                "alpha": self.alpha, "intercept": self.intercept, "tau": self.tau,
                "alpha_ci": None if self.alpha_ci is None else [finite(v) for v in self.alpha_ci],
                "residuals": [{"n": n, "residual": r} for n, r in self.residuals],
                "cells": len(self.observations),
                "censored": sum(not o.located for o in self.observations),
                "located": sum(o.located for o in self.observations),
                "statistic": finite(self.statistic), "df": self.df, "p_value": self.p_value,
                "verdict": self.verdict, "reason": self.reason}

    def predict(self, n: float) -> tuple[float, float, float] | None:
        """``(m*, low, high)`` at ``n``: the law's value with its profile interval widened by
        ``1.96 tau`` in quadrature (a new cell's spread); None when not identified."""
        if self.alpha is None or self.intercept is None or self.tau is None:
            return None
        obs, x = list(self.observations), math.log(n)
        y = self.intercept + self.alpha * x
        lo, hi = _profile(obs, "y_at", y, self.log_lik, _threshold(len(obs)), {"x_at": x}, 0.1)
        spread = Z95 * self.tau
        lo = y - math.hypot(y - lo, spread) if math.isfinite(lo) else lo
        hi = y + math.hypot(hi - y, spread) if math.isfinite(hi) else hi
        return math.exp(y), math.exp(lo), math.exp(hi)


def _residual(o: Observation, mu: float, tau: float) -> float:
    sd = math.hypot(o.s, tau)
    if o.located:
        return (o.y - mu) / sd
    return (max(o.low - mu, 0.0) - max(mu - o.high, 0.0)) / sd


def fit_law(cells: list[CurveCell], regime: str, *, with_censored: bool = True) -> LawFit:
    """The :class:`LawFit` of ``regime``'s cells (censored ones as interval observations, or
    left out with ``with_censored=False``)."""
    mine = sorted((c for c in cells if c.regime == regime), key=lambda c: c.n)
    obs = [o for o in map(observation, mine) if with_censored or o.located]
    located_ns = {o.n for o in obs if o.located}
    if len(located_ns) < 2:
        return LawFit(regime, with_censored, None, None, None, None, (), math.nan, 0, None,
                      "untested", f"m* located at {len(located_ns)} value(s) of n (need 2)",
                      tuple(obs))
    top, p = _maximise(obs, {})
    k = len(obs)
    fixed = _maximise(obs, {"tau": 0.0})[0]
    saturated = sum(-0.5 * math.log(2 * math.pi * o.s ** 2) for o in obs if o.located)
    statistic = max(2 * (saturated - fixed), 0.0)
    residuals = tuple((o.n, _residual(o, p["c"] + p["alpha"] * math.log(o.n), p["tau"]))
                      for o in obs)
    if k <= 2:
        return LawFit(regime, with_censored, p["alpha"], p["c"], p["tau"], None, residuals,
                      statistic, 0, None, "untested",
                      "2 cells: a line passes through any 2, so the law cannot be tested",
                      tuple(obs), top)
    pval = float(sps.chi2.sf(statistic, k - 2))
    ci = _profile(obs, "alpha", p["alpha"], top, _threshold(k), {}, 0.05)
    verdict = "fits" if pval >= FIT_P else "does not fit"
    reason = (f"lack-of-fit chi-square {statistic:.3g} on {k - 2} df, p = {pval:.3g}: " +
              ("one power law describes these cells within their own uncertainty" if
               verdict == "fits" else "one power law does not describe these cells"))
    return LawFit(regime, with_censored, p["alpha"], p["c"], p["tau"], ci, residuals,
                  statistic, k - 2, pval, verdict, reason, tuple(obs), top)


@dataclass(frozen=True)
class Recommendation:
    """m for the user's n and where it comes from.

    Attributes:
        regime, target_n: For whom. source: ``law`` (the tested law's prediction), ``nearest
            cell`` (the measured cell nearest the target in log n), ``verify stage`` (m*
            measured at the target n itself, :func:`measured_at_target`) or ``none``.
        m, low, high: The value and its 95% interval (m None where only bounds are known;
            low 0 / high inf where open).
        n_used: The n the value was measured at (the target when from the law).
        extrapolation: The law's prediction lies outside the swept n.
        reason: In words, why this source.
        prediction: For ``verify stage`` (m* measured at the target n,
            :func:`measured_at_target`): what the grid's rule (law or nearest cell) had
            predicted there before the measurement; None otherwise.
    """

    regime: str
    target_n: int
    source: str
    m: float | None
    low: float
    high: float
    n_used: int
    extrapolation: bool
    reason: str
    prediction: Recommendation | None = None

    @property
    def prediction_inside(self) -> bool | None:
        """Whether the measured m* at the target n lies inside the prediction's interval (its
        interval's bounds for a censored reading: the two overlap); None without both."""
        p = self.prediction
        if p is None or (p.m is None and p.low <= 0 and math.isinf(p.high)):
            return None
        if self.m is not None:
            return p.low <= self.m <= p.high
        return self.low <= p.high and p.low <= self.high

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (open ends are None)."""
        return {"regime": self.regime, "target_n": self.target_n, "source": self.source,
                "m": self.m, "m_over_n": None if self.m is None else self.m / self.target_n,
                "low": finite(self.low), "high": finite(self.high),
                "n_used": self.n_used, "extrapolation": self.extrapolation,
                "reason": self.reason,
                "prediction": None if self.prediction is None else self.prediction.to_dict(),
                "prediction_inside": self.prediction_inside}


def measured_at_target(cell: CurveCell, prediction: Recommendation) -> Recommendation:
    """The recommendation once m* is measured at the target n (the verify stage's runs read as
    one more cell, :mod:`.curves`): that cell's m* and its seed-resampling interval, with the
    grid's ``prediction`` kept beside it. A censored reading gives only bounds (m None).

    Example:
        >>> from crl.experiments.negatives.curves import estimate_curve_cell
        >>> from crl.experiments.negatives.tolerance import Tolerance
        >>> ms = (250.0, 500.0, 1000.0, 4000.0)
        >>> table = np.array([[0.50, 0.58, 0.60, 0.60], [0.52, 0.59, 0.61, 0.61],
        ...                   [0.51, 0.58, 0.60, 0.61]])
        >>> cell = estimate_curve_cell("shared", 4000, ms, (0, 1, 2), table,
        ...                            Tolerance.parse(0.01), rng=np.random.default_rng(0))
        >>> law = Recommendation("shared", 4000, "law", 500.0, 400.0, 640.0, 4000, True, "fits")
        >>> rec = measured_at_target(cell, law)
        >>> rec.source, rec.m == cell.m_star, rec.prediction_inside
        ('verify stage', True, False)
    """
    seeds = len(cell.seeds)
    where = (f"measured at the target n = {cell.n:,} by the verify stage ({seeds} seeds, "
             f"{len(cell.ms)} m; {cell.method} curve)")
    reason = where + (f": {cell.reason}" if cell.m_star is None else "")
    return Recommendation(cell.regime, cell.n, "verify stage", cell.m_star, cell.lower,
                          cell.upper, cell.n, False, reason, prediction)


def recommend(law: LawFit, cells: list[CurveCell], target_n: int) -> Recommendation:
    """The recommendation rule: the law's prediction at ``target_n`` when it fits, else the
    measured cell of ``law.regime`` nearest ``target_n`` in ``log n``."""
    mine = [c for c in cells if c.regime == law.regime]
    swept = [c.n for c in mine]
    predicted = law.predict(target_n) if law.verdict == "fits" else None
    if predicted is not None:
        outside = not min(swept) <= target_n <= max(swept)
        capped = predicted[0] > target_n
        m, low, high = (min(v, float(target_n)) for v in predicted)
        return Recommendation(law.regime, target_n, "law", m, low, high, target_n, outside,
                              f"the law fits ({law.reason})"
                              + ("; an extrapolation outside the swept n" if outside else "")
                              + ("; capped at m = n (every other sample)" if capped else ""))
    if not mine:
        return Recommendation(law.regime, target_n, "none", None, 0.0, math.inf, target_n,
                              False, "no cells")
    near = min(mine, key=lambda c: (abs(math.log(c.n / target_n)), c.n))
    why = (f"the law {law.verdict} ({law.reason}); the measured cell nearest the target, at "
           f"n = {near.n:,}")
    if near.m_star is None:
        why += f", only bounds m*: {near.reason}"
    return Recommendation(law.regime, target_n, "nearest cell", near.m_star, near.lower,
                          near.upper, near.n, False, why)
