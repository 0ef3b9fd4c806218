"""How many negatives a data set can use: the critical ``m*(n)`` (docs/theory.md §7).

Per regime and per number of anchors ``n``, fit ``err(m) = E_inf + A m^-beta`` (beta free) to a
sweep over ``m``; the critical number of negatives for a tolerance ``delta`` is the smallest ``m``
within ``delta`` of the asymptote, ``m*(n; delta) = (A / delta)^(1/beta)``. Then fit
``log m* = alpha log n + c`` with a free intercept. Intervals come from a residual bootstrap of
each per-n fit (the ``alpha`` interval refits the line on each bootstrap draw of the ``m*``). A
saturating exponential ``E_inf + A exp(-m / m0)`` is fitted alongside and the two compared by AIC.

The fits are least squares profiled over the one nonlinear parameter (``beta`` or ``m0``): for a
fixed value the model is linear in ``(E_inf, A)``; the profile is minimised on a log grid refined
by parabolic interpolation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from crl._validation import check_int_range, describe
from crl.errors import CrlTypeError, CrlValueError

FloatArray = NDArray[np.float64]
_NAN = float("nan")
_BETA_RANGE = (0.01, 8.0)
_BETA_TOO_SMALL = 0.05


@dataclass(frozen=True)
class PowerLawFit:
    """The fit of one ``(regime, n)`` sweep; ``reason`` is empty when ``m*`` is identified."""

    regime: str
    n: float
    num_points: int
    num_m: int
    e_inf: float
    e_inf_ci: tuple[float, float]
    amplitude: float
    amplitude_ci: tuple[float, float]
    beta: float
    beta_ci: tuple[float, float]
    m_star: float
    m_star_ci: tuple[float, float]
    m_star_over_n: float
    extrapolated: bool
    aic_power: float
    aic_exponential: float
    exponential_m0: float
    preferred: str
    bootstrap_valid: float
    reason: str


@dataclass(frozen=True)
class RegimeScaling:
    """``log m* = alpha log n + intercept`` for one regime; ``reason`` empty when identified."""

    regime: str
    alpha: float
    alpha_ci: tuple[float, float]
    intercept: float
    n_values: tuple[float, ...]
    m_stars: tuple[float, ...]
    reason: str


@dataclass(frozen=True)
class CriticalMResult:
    """Everything :func:`fit_critical_m` found."""

    tolerance: float
    metric: str
    higher_is_better: bool
    fits: tuple[PowerLawFit, ...]
    regimes: dict[str, RegimeScaling]
    dropped_rows: int
    notes: tuple[str, ...] = field(default=())

    def fit(self, regime: str, n: float) -> PowerLawFit:
        """The per-n fit of ``regime`` at ``n``."""
        for f in self.fits:
            if f.regime == regime and f.n == n:
                return f
        raise CrlValueError(f"CriticalMResult.fit: no fit for regime={regime!r}, n={n}; have "
                            + ", ".join(f"({f.regime!r}, {f.n:g})" for f in self.fits))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN and infinities become None)."""
        return dict(_json_safe(asdict(self)))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _columns(results: Any) -> dict[str, NDArray[Any]]:
    """A results table (list of dicts, dict of columns, structured array) as numpy columns."""
    if isinstance(results, np.ndarray) and results.dtype.names:
        return {name: np.asarray(results[name]) for name in results.dtype.names}
    if isinstance(results, Mapping):
        return {str(k): np.asarray(v) for k, v in results.items()}
    if isinstance(results, Sequence) and not isinstance(results, (str, bytes)):
        rows = list(results)
        if not all(isinstance(r, Mapping) for r in rows):
            raise CrlTypeError("fit_critical_m: `results` as a sequence must hold dicts (rows); "
                               f"got {describe(rows[:2])}")
        keys = sorted({str(k) for r in rows for k in r})
        return {k: np.asarray([r.get(k, None) for r in rows], dtype=object) for k in keys}
    raise CrlTypeError("fit_critical_m: `results` must be a list of dicts, a dict of columns or a "
                       f"numpy structured array; got {describe(results)}")


def _as_float(values: NDArray[Any]) -> FloatArray:
    out = np.full(values.shape, np.nan)
    for i, v in enumerate(values.tolist()):
        try:
            out[i] = float(v)
        except (TypeError, ValueError):
            pass
    return out


# Extreme tables (values near the float range) overflow in the sums of squares; such fits come
# out non-finite and are reported as unidentified by the callers, without a warning per array.
@np.errstate(over="ignore", divide="ignore", invalid="ignore")
def _profile_fit(m: FloatArray, e: FloatArray, basis: str,
                 grid: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Least squares of ``e (N, B)`` on ``[1, phi_theta(m)]`` profiled over ``theta``.

    Returns per column: ``E_inf (B,)``, ``A (B,)``, ``theta (B,)``, ``RSS (B,)``.
    """

    def design(theta: FloatArray) -> FloatArray:  # (G, N) -> basis values
        if basis == "power":
            return np.asarray(m[None, :] ** -theta[:, None], dtype=np.float64)
        return np.asarray(np.exp(-m[None, :] / theta[:, None]), dtype=np.float64)

    def solve(theta: FloatArray, cols: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        # theta (K,), cols (K, N): closed-form 2-parameter least squares per row.
        phi = design(theta)  # (K, N)
        pm, em = phi.mean(1, keepdims=True), cols.mean(1, keepdims=True)
        sxx = ((phi - pm) ** 2).sum(1)
        sxy = ((phi - pm) * (cols - em)).sum(1)
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(sxx > 1e-300, sxy / sxx, 0.0)
        c = em[:, 0] - a * pm[:, 0]
        rss = ((cols - c[:, None] - a[:, None] * phi) ** 2).sum(1)
        return c, a, rss

    phi = design(grid)  # (G, N)
    pm = phi.mean(1, keepdims=True)
    centred = phi - pm
    sxx = (centred**2).sum(1)  # (G,)
    em = e.mean(0, keepdims=True)  # (1, B)
    sxy = centred @ (e - em)  # (G, B)
    syy = ((e - em) ** 2).sum(0)  # (B,)
    with np.errstate(divide="ignore", invalid="ignore"):
        rss = syy[None, :] - np.where(sxx[:, None] > 1e-300, sxy**2 / sxx[:, None], 0.0)
    best = np.argmin(rss, axis=0)  # (B,)
    lg = np.log(grid)
    inner = np.clip(best, 1, len(grid) - 2)
    cols = np.arange(e.shape[1])
    y0, y1, y2 = rss[inner - 1, cols], rss[inner, cols], rss[inner + 1, cols]
    denom = y0 - 2 * y1 + y2
    step = lg[1] - lg[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = np.where(denom > 0, 0.5 * (y0 - y2) / denom, 0.0)
    log_theta = np.where((best > 0) & (best < len(grid) - 1),
                         lg[inner] + np.clip(shift, -1.0, 1.0) * step, lg[best])
    theta = np.exp(log_theta)
    c, a, r = solve(theta, e.T)
    # Keep the grid point if the refinement did not help.
    worse = r > rss[best, cols]
    if np.any(worse):
        c2, a2, r2 = solve(grid[best], e.T)
        c, a, r = np.where(worse, c2, c), np.where(worse, a2, a), np.where(worse, r2, r)
        theta = np.where(worse, grid[best], theta)
    return c, a, theta, r


def _aic(rss: float, n: int, k: int = 3) -> float:
    if n <= k:
        return _NAN
    return n * math.log(max(rss / n, 1e-300)) + 2 * k


def _interval(values: FloatArray, confidence: float) -> tuple[float, float]:
    v = values[np.isfinite(values)]
    if v.size < 2:
        return (_NAN, _NAN)
    lo, hi = np.quantile(v, [(1 - confidence) / 2, (1 + confidence) / 2])
    return (float(lo), float(hi))


def _range_reason(m_star: float, span: tuple[float, float], e_inf: float,
                  error_bounds: tuple[float, float]) -> str:
    """Why a computed ``m*`` is not identified by the sweep ("" when it is)."""
    low, high = error_bounds
    if not low <= e_inf <= high:
        return (f"impossible asymptote: E_inf = {e_inf:.3g} lies outside the error's range "
                f"[{low:g}, {high:g}]")
    if m_star > span[1]:
        return f"fitted m* = {m_star:.3g} lies beyond the largest swept m ({span[1]:g})"
    if m_star < span[0]:
        return f"fitted m* = {m_star:.3g} lies below the smallest swept m ({span[0]:g})"
    return ""


def _fit_one(regime: str, n: float, m: FloatArray, e: FloatArray, tolerance: float,
             num_bootstrap: int, confidence: float, rng: np.random.Generator,
             error_bounds: tuple[float, float]) -> tuple[PowerLawFit, FloatArray]:
    """One ``(regime, n)`` fit and its bootstrap ``m*`` draws ``(num_bootstrap,)``."""
    num_m = int(np.unique(m).size)
    nan2 = (_NAN, _NAN)
    empty = np.full(num_bootstrap, np.nan)
    if num_m < 3:
        return PowerLawFit(regime, n, int(m.size), num_m, _NAN, nan2, _NAN, nan2, _NAN, nan2,
                           _NAN, nan2, _NAN, False, _NAN, _NAN, _NAN, "", 0.0,
                           f"need at least 3 distinct m to fit E_inf + A m^-beta; got {num_m}"
                           ), empty
    beta_grid = np.exp(np.linspace(math.log(_BETA_RANGE[0]), math.log(_BETA_RANGE[1]), 300))
    c, a, beta, rss = _profile_fit(m, e[:, None], "power", beta_grid)
    e_inf, amp, b, r = float(c[0]), float(a[0]), float(beta[0]), float(rss[0])
    span = (float(m.min()), float(m.max()))
    m0_grid = np.exp(np.linspace(math.log(span[0] / 20), math.log(span[1] * 20), 300))
    _, _, m0, rss_exp = _profile_fit(m, e[:, None], "exp", m0_grid)
    aic_p, aic_e = _aic(r, m.size), _aic(float(rss_exp[0]), m.size)
    preferred = "" if not (math.isfinite(aic_p) and math.isfinite(aic_e)) else (
        "power" if aic_p <= aic_e else "exponential")

    # Residual bootstrap.
    fitted = e_inf + amp * m**-b
    resid = e - fitted
    if m.size > 3:
        resid = (resid - resid.mean()) * math.sqrt(m.size / (m.size - 3))
    draws = fitted[:, None] + rng.choice(resid, size=(m.size, num_bootstrap), replace=True)
    bc, ba, bb, _ = _profile_fit(m, draws, "power", beta_grid)
    ok = (ba > 0) & (bb > _BETA_TOO_SMALL)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        boot_m = np.where(ok, (np.maximum(ba, 1e-300) / tolerance) ** (1.0 / bb), np.nan)
    valid = float(ok.mean())

    reason = ""
    m_star = _NAN
    if amp <= 0:
        reason = "no improvement with m (fitted A <= 0)"
    elif b <= _BETA_TOO_SMALL:
        reason = f"beta ~ 0 ({b:.3g}): no saturation in the swept range of m"
    elif not math.isfinite(r):
        reason = "the fit failed (non-finite residuals)"
    else:
        log_m_star = math.log(amp / tolerance) / b
        if log_m_star > 700.0:
            reason = f"m* overflows (log m* = {log_m_star:.3g}): beta too small for this tolerance"
        else:
            m_star = math.exp(log_m_star)
    extrapolated = bool(math.isfinite(m_star) and m_star > span[1])
    if not reason:
        reason = _range_reason(m_star, span, e_inf, error_bounds)
    if reason:
        m_star = _NAN
    m_ci = _interval(boot_m, confidence) if valid >= 0.5 and not reason else nan2
    fit = PowerLawFit(
        regime=regime, n=n, num_points=int(m.size), num_m=num_m, e_inf=e_inf,
        e_inf_ci=_interval(bc, confidence), amplitude=amp, amplitude_ci=_interval(ba, confidence),
        beta=b, beta_ci=_interval(bb, confidence), m_star=m_star, m_star_ci=m_ci,
        m_star_over_n=m_star / n if n > 0 else _NAN,
        extrapolated=extrapolated,
        aic_power=aic_p, aic_exponential=aic_e, exponential_m0=float(m0[0]), preferred=preferred,
        bootstrap_valid=valid, reason=reason,
    )
    return fit, boot_m


def _fit_alpha(regime: str, fits: list[PowerLawFit], boots: list[FloatArray],
               confidence: float) -> RegimeScaling:
    keep = [i for i, f in enumerate(fits) if not f.reason and f.m_star > 0 and f.n > 0]
    ns = tuple(fits[i].n for i in keep)
    ms = tuple(fits[i].m_star for i in keep)
    if len(set(ns)) < 2:
        return RegimeScaling(regime, _NAN, (_NAN, _NAN), _NAN, ns, ms,
                             f"m* identified for {len(set(ns))} value(s) of n; need >= 2")
    x = np.log(np.array(ns))
    slope, intercept = np.polyfit(x, np.log(np.array(ms)), 1)
    boot = np.stack([boots[i] for i in keep])  # (K, B)
    good = np.all(np.isfinite(boot) & (boot > 0), axis=0)
    alphas = np.full(boot.shape[1], np.nan)
    if np.any(good):
        logs = np.log(boot[:, good])  # (K, B')
        xc = x - x.mean()
        alphas[good] = (xc @ (logs - logs.mean(0))) / (xc @ xc)
    ci = _interval(alphas, confidence) if good.mean() >= 0.5 else (_NAN, _NAN)
    note = "" if good.mean() >= 0.5 else "alpha interval omitted: most bootstrap draws lost m*"
    return RegimeScaling(regime, float(slope), ci, float(intercept), ns, ms, note)


def fit_critical_m(results: Any, tolerance: float, *, metric: str = "metric",
                   higher_is_better: bool = False, num_bootstrap: int = 400,
                   confidence: float = 0.95, seed: int = 0,
                   error_bounds: tuple[float, float] = (-math.inf, math.inf)
                   ) -> CriticalMResult:
    """Fit ``err(m) = E_inf + A m^-beta`` per (regime, n), ``m*(n; delta)`` and ``alpha``.

    Args:
        results: A table with columns ``n``, ``m``, the ``metric`` column and optionally
            ``regime`` (default: one regime ``"all"``) and ``seed`` (seeds are simply more
            points): a list of row dicts, a dict of columns or a numpy structured array. Rows
            with a missing or non-finite ``n``, ``m`` (> 0 required) or metric are dropped and
            counted.
        tolerance: ``delta > 0``, in the metric's units.
        metric: Name of the metric column.
        higher_is_better: If True the metric is a score (e.g. recall) and ``err = 1 - metric``
            is fitted (``A``, ``beta`` and ``m*`` do not depend on that offset).
        num_bootstrap: Residual-bootstrap draws per fit (>= 20).
        confidence: Level of the intervals.
        seed: Seed of the bootstrap.
        error_bounds: The values the fitted error can take (``(0, 1)`` for ``1 - recall``); a
            fit whose asymptote ``E_inf`` lies outside is unidentified, as is one whose ``m*``
            lies outside the swept range of ``m``.

    Returns:
        A :class:`CriticalMResult`: per-(regime, n) :class:`PowerLawFit` and per-regime
        :class:`RegimeScaling`. Unidentifiable quantities are NaN with a ``reason``.

    Example:
        >>> rows = [{"n": n, "m": m, "regime": "shared", "seed": 0,
        ...          "metric": 0.1 + 0.01 * (n ** 0.5 / m) ** 0.5}
        ...         for n in (100, 400, 1600) for m in (1, 4, 16, 64, 256, 1024)]
        >>> res = fit_critical_m(rows, 0.01, num_bootstrap=50)
        >>> round(res.regimes["shared"].alpha, 3), round(res.fits[0].beta, 3)
        (0.5, 0.5)
    """
    where = "fit_critical_m"
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) \
            or not (math.isfinite(tolerance) and tolerance > 0):
        raise CrlValueError(f"{where}: `tolerance` must be a positive number; got "
                            f"{describe(tolerance)}")
    check_int_range(where, "num_bootstrap", num_bootstrap, 20, None)
    if not 0.0 < confidence < 1.0:
        raise CrlValueError(f"{where}: `confidence` must be in (0, 1); got {confidence}")
    cols = _columns(results)
    if not cols or all(np.asarray(v).size == 0 for v in cols.values()):
        return CriticalMResult(tolerance=float(tolerance), metric=metric,
                               higher_is_better=higher_is_better, fits=(), regimes={},
                               dropped_rows=0, notes=("empty results table",))
    missing = [c for c in ("n", "m", metric) if c not in cols]
    if missing:
        raise CrlValueError(f"{where}: the results table lacks column(s) {missing}; it has "
                            f"{sorted(cols)} (set `metric=` to the metric's column name)")
    lengths = {k: int(np.asarray(v).reshape(-1).shape[0]) for k, v in cols.items()}
    if len(set(lengths.values())) > 1:
        raise CrlValueError(f"{where}: all columns must have the same length; got {lengths}")
    n_all, m_all, v_all = (_as_float(np.asarray(cols[k]).reshape(-1)) for k in ("n", "m", metric))
    size = n_all.size
    regime_all = (np.asarray([str(r) for r in np.asarray(cols["regime"]).reshape(-1).tolist()])
                  if "regime" in cols else np.full(size, "all"))
    err_all = 1.0 - v_all if higher_is_better else v_all
    keep = np.isfinite(n_all) & np.isfinite(m_all) & np.isfinite(err_all) & (m_all > 0) \
        & (n_all > 0)
    dropped = int(size - keep.sum())
    rng = np.random.default_rng(seed)
    fits: list[PowerLawFit] = []
    regimes: dict[str, RegimeScaling] = {}
    for regime in sorted(set(regime_all[keep].tolist())):
        in_regime = keep & (regime_all == regime)
        reg_fits, reg_boots = [], []
        for n in sorted(set(n_all[in_regime].tolist())):
            rows = in_regime & (n_all == n)
            fit, boot = _fit_one(regime, float(n), m_all[rows], err_all[rows], float(tolerance),
                                 num_bootstrap, confidence, rng, error_bounds)
            reg_fits.append(fit)
            reg_boots.append(boot)
        fits.extend(reg_fits)
        regimes[regime] = _fit_alpha(regime, reg_fits, reg_boots, confidence)
    notes = (f"dropped {dropped} row(s) with missing or invalid n, m or {metric}",) if dropped \
        else ()
    return CriticalMResult(tolerance=float(tolerance), metric=metric,
                           higher_is_better=higher_is_better, fits=tuple(fits), regimes=regimes,
                           dropped_rows=dropped, notes=notes)
