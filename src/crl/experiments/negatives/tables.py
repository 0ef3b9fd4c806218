"""The tables of the negatives report: m* per cell, the laws with their residuals, the
recommendations with their backtests, the sensitivity to the tolerance, the per-cell power-law
cross-check and the gains in the paper's units (docs/negatives.md, "The report")."""

from __future__ import annotations

import math
from typing import Any

from crl.experiments.metrics import MetricSpec
from crl.experiments.negatives.answer import Answer
from crl.experiments.negatives.curves import CurveCell
from crl.experiments.negatives.text import m_text, pct
from crl.experiments.negatives.verdict import interval_text
from crl.experiments.study import Table
from crl.theory.scaling import CriticalMResult


def ci_text(ci: tuple[float, float]) -> str:
    """An interval as text, with dashes for missing ends."""
    return ", ".join(f"{v:.3g}" if math.isfinite(v) else "—" for v in ci)


def cell_table(cells: list[CurveCell], spec: MetricSpec, batch_size: int) -> Table:
    """m* of every (regime, n) read from its fitted curve, with its resampling interval, the
    grid's resolution, the negatives per step at m* and the reading in words."""
    return Table(
        "m* per (regime, n): where the fitted curve comes within the tolerance of its top",
        ["regime", "n", "swept m", "seeds", "curve", "m*", "m* (% of n)",
         "95% interval (seed resamples)", "grid step around m* (factor)",
         f"negatives per step at m* (k = B m / n, B = {batch_size})", "reading"],
        [[c.regime, c.n, len(c.ms), len(c.seeds), c.method, m_text(c.m_star),
          pct(c.m_star, c.n) if c.m_star is not None else "—",
          f"[{m_text(c.lower)}, {m_text(c.upper)}]", c.resolution,
          "—" if c.m_star is None else min(batch_size, c.n) * c.m_star / c.n,
          c.status] for c in cells])


def law_table(result: Answer) -> Table:
    """Per regime, the law with and without its censored cells and its lack-of-fit test."""
    rows = []
    for regime, law in result.laws.items():
        for fit in (law, result.laws_located[regime]):
            rows.append([regime, "yes" if fit.with_censored else "no",
                         sum(o.located for o in fit.observations),
                         sum(not o.located for o in fit.observations),
                         interval_text(fit.alpha, fit.alpha_ci),
                         "—" if fit.tau is None else fit.tau,
                         "—" if fit.p_value is None else f"{fit.statistic:.3g} on {fit.df} df",
                         "—" if fit.p_value is None else fit.p_value, fit.verdict])
    return Table("m*(n) = e^c n^alpha per regime: interval-censored likelihood with a scatter "
                 "tau across cells", ["regime", "censored cells in", "cells located",
                                      "cells censored", "alpha [95% CI]", "tau (log m*)",
                                      "lack of fit (chi-square)", "p", "verdict"], rows)


def residual_table(result: Answer) -> Table:
    """Each cell's standardised residual from its regime's law (a censored cell's: its
    distance outside its bounds, 0 inside)."""
    rows = []
    for regime, law in result.laws.items():
        without = dict(result.laws_located[regime].residuals)
        for n, r in law.residuals:
            rows.append([regime, n, r, without.get(n, "— (left out)")])
    return Table("Residuals from the law per cell (standard deviations)",
                 ["regime", "n", "residual (with censored cells)",
                  "residual (without censored cells)"], rows)


def recommendation_table(result: Answer) -> Table:
    """The recommendation per regime, where it comes from, and the backtest."""
    rows = []
    for regime, rec in result.recommendations.items():
        test = result.backtests.get(regime)
        p = rec.prediction
        predicted = ("—" if p is None else
                     f"{m_text(p.m)} [{m_text(p.low)}, {m_text(p.high)}] ({p.source}"
                     + (", extrapolated" if p.extrapolation else "") + ")")
        inside = rec.prediction_inside
        rows.append([regime, rec.target_n, rec.source, m_text(rec.m),
                     f"[{m_text(rec.low)}, {m_text(rec.high)}]", rec.n_used,
                     "yes" if rec.extrapolation else "no", predicted,
                     "—" if inside is None else "inside" if inside else "outside",
                     "—" if test is None else test.reason])
    return Table("The recommendation per regime, the grid's prediction at the target n "
                 "where the verify stage measured it, and the backtest (the largest n "
                 "predicted from the others)",
                 ["regime", "target n", "source", "m", "95% interval", "n measured at",
                  "extrapolation", "the grid predicted", "measurement in it", "backtest"],
                 rows)


def sensitivity_table(answers: list[Answer]) -> Table:
    """m* per cell, alpha per regime and the recommendation at each tolerance."""
    ns = sorted({c.n for a in answers for c in a.cells})
    rows = []
    for a in answers:
        for regime, law in a.laws.items():
            by_n = {c.n: c for c in a.cells if c.regime == regime}
            rec = a.recommendations[regime]
            rows.append([str(a.tolerance), regime,
                         *[_reading(by_n[n]) if n in by_n else "—" for n in ns],
                         interval_text(law.alpha, law.alpha_ci), law.verdict,
                         f"{m_text(rec.m)} ({rec.source})"])
    return Table("Sensitivity to the tolerance: half, the chosen and twice",
                 ["tolerance", "regime", *[f"m* at n = {n:,}" for n in ns], "alpha [95% CI]",
                  "law", "recommended m (source)"], rows)


def _reading(c: CurveCell) -> str:
    if c.m_star is not None:
        return m_text(c.m_star)
    return f">= {m_text(c.lower)}" if c.status == "above" else f"<= {m_text(c.upper)}"


def fit_table(fitted: CriticalMResult) -> Table:
    """The per-cell power-law fits, with why a fit does not identify m*."""
    return Table("Cross-check: per-cell fits of err(m) = E_inf + A m^-beta",
                 ["regime", "n", "E_inf", "A", "beta", "beta 95% CI", "m*", "m* 95% CI",
                  "m* (% of n)", "AIC prefers", "note"],
                 [[f.regime, f.n, f.e_inf, f.amplitude, f.beta, f"[{ci_text(f.beta_ci)}]",
                   f.m_star, f"[{ci_text(f.m_star_ci)}]", pct(f.m_star, f.n), f.preferred,
                   f.reason or "ok"] for f in fitted.fits])


def gains(cells: list[CurveCell]) -> list[dict[str, Any]]:
    """Seed-adjusted means at m = 10%, 40% and 100% of n (where swept), and the gains."""
    out = []
    for c in cells:
        at = {}
        for fraction in (0.1, 0.4, 1.0):
            m = float(max(1, round(fraction * c.n)))
            at[fraction] = c.means[c.ms.index(m)] if m in c.ms else math.nan
        out.append({"regime": c.regime, "n": c.n, "at_10": at[0.1], "at_40": at[0.4],
                    "at_100": at[1.0], "gain_10_to_40": at[0.4] - at[0.1],
                    "gain_40_to_100": at[1.0] - at[0.4]})
    return out


def gains_table(rows: list[dict[str, Any]], spec: MetricSpec, higher: bool) -> Table:
    """The paper's comparison: the metric at 10/40/100% of n, gains in the paper's units."""
    sign = 1.0 if higher else -1.0
    return Table(f"{spec.name} at m = 10%, 40% and 100% of n, and the gains in {spec.unit}",
                 ["regime", "n", "10%", "40%", "100%", f"gain 10→40% ({spec.unit})",
                  f"gain 40→100% ({spec.unit})"],
                 [[g["regime"], g["n"], sign * g["at_10"], sign * g["at_40"],
                   sign * g["at_100"], spec.points(g["gain_10_to_40"]),
                   spec.points(g["gain_40_to_100"])] for g in rows])
