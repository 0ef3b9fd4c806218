"""The words and tables of the negatives report: the answer for the user's n, m* per cell, the
refinement, the power-law cross-check and the comparison with the paper (in its units)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from crl.experiments.metrics import MetricSpec
from crl.experiments.negatives.paper import PAPER
from crl.experiments.negatives.stats import GOOD_WIDTH, REGIMES, CellEstimate, ScalingLaw
from crl.experiments.study import Table
from crl.theory.scaling import CriticalMResult


def ci_text(ci: tuple[float, float]) -> str:
    """An interval as text, with dashes for missing ends."""
    return ", ".join(f"{v:.3g}" if math.isfinite(v) else "—" for v in ci)


def pct(m: float, n: float) -> str:
    """``m`` in % of ``n``."""
    return f"{100 * m / n:.3g}%" if math.isfinite(m) else "—"


def cell_text(c: CellEstimate) -> str:
    """What a cell says about m*, in words."""
    if c.status == "above":
        return f"not saturated: m* >= {c.m_star:,} ({pct(c.m_star, c.n)} of n)"
    if c.status == "below":
        return (f"saturated at the smallest swept m: m* <= {c.ms[0]:,} ({pct(c.ms[0], c.n)} "
                f"of n; the best m gains {c.gain:.3g} over it)")
    return (f"m* = {c.m_star:,} ({pct(c.m_star, c.n)} of n), 95% interval "
            f"[{c.lower:,.0f}, {c.upper:,.0f}] ({pct(c.lower, c.n)} to {pct(c.upper, c.n)}), "
            f"a factor {c.width:.2g}")


def recommendation(law: ScalingLaw, target_n: int, swept: tuple[int, int]) -> dict[str, Any]:
    """m*(target_n) of one regime's law, capped at the target's other anchors."""
    point, lo, hi = law.predict(float(target_n))
    cap = float(max(1, target_n - 1))
    return {"regime": law.regime, "target_n": target_n, "m": min(point, cap),
            "low": min(lo, cap), "high": min(hi, cap), "capped": point > cap,
            "extrapolation": not swept[0] <= target_n <= swept[1], "reason": law.reason}


def recommendation_text(rec: dict[str, Any]) -> str:
    """The answer for the user's n, in the issue's words."""
    regime, n = rec["regime"], rec["target_n"]
    if not math.isfinite(rec["m"]):
        return (f"With {regime} negatives at n = {n:,}: no recommendation, the m*(n) law is "
                f"not identified ({rec['reason']}).")
    text = (f"With {regime} negatives at n = {n:,}, use m of about {rec['m']:,.0f} per anchor "
            f"({pct(rec['m'], n)} of n; 95% interval [{rec['low']:,.0f}, {rec['high']:,.0f}]); "
            "past that, more anchors help more than more negatives.")
    if rec["capped"]:
        text += " The law asks for more than all other anchors, so use them all."
    if rec["extrapolation"]:
        text += " This is an extrapolation: n lies outside the swept range."
    return text


def law_table(laws: dict[str, ScalingLaw], recs: list[dict[str, Any]]) -> Table:
    """One alpha per regime, with its interval and the recommendation."""
    rows = []
    for regime, law in laws.items():
        rec = next(r for r in recs if r["regime"] == regime)
        rows.append([regime, law.alpha, f"[{ci_text(law.alpha_ci)}]", law.located,
                     law.censored, law.left_out, rec["target_n"], rec["m"],
                     f"[{ci_text((rec['low'], rec['high']))}]",
                     "yes" if rec["extrapolation"] else "no", law.reason or "ok"])
    return Table("m*(n) = e^c n^alpha per regime (censored cells as bounds)",
                 ["regime", "alpha", "alpha 95% CI", "cells located",
                  "not saturated (lower bounds)", "saturated at the smallest m (left out)",
                  "target n", "m* at target n", "95% interval", "extrapolation", "note"], rows)


def cell_table(cells: list[CellEstimate], spec: MetricSpec) -> Table:
    """m* of every (regime, n), with its runs and its status."""
    return Table(
        "m* per (regime, n): smallest swept m within the tolerance of the best, paired by seed",
        ["regime", "n", "swept m", "seeds", "m*", "m* (% of n)", "95% interval (% of n)",
         "width (factor)", f"gain of the best m over the smallest ({spec.unit})", "reading"],
        [[c.regime, c.n, len(c.ms), len(c.seeds), c.m_star, pct(c.m_star, c.n),
          (f"{pct(c.lower, c.n)} to {pct(c.upper, c.n)}" if c.status == "located" else
           "censored"), c.width if c.status == "located" else "—", spec.points(c.gain),
          cell_text(c)] for c in cells])


def goal_text(cells: list[CellEstimate]) -> str:
    """How many cells meet the goal (interval within a factor 2.5, or honestly censored)."""
    good = [c for c in cells if c.informative]
    wide = [c for c in cells if not c.informative]
    text = (f"{len(good)} of {len(cells)} (regime, n) cells have an m* interval no wider than a "
            f"factor {GOOD_WIDTH:g} or are censored (an honest bound).")
    if wide:
        text += " Too wide: " + "; ".join(
            f"{c.regime} n = {c.n:,} (factor {c.width:.2g}: "
            + ("the seeds disagree on m*" if len(set(c.draws)) > 1 else "the swept m are too "
               "far apart") + ")" for c in wide) + "."
    return text


def fit_table(fitted: CriticalMResult) -> Table:
    """The per-cell power-law fits, with why a fit does not identify m*."""
    return Table("Cross-check: per-cell fits of err(m) = E_inf + A m^-beta",
                 ["regime", "n", "E_inf", "A", "beta", "beta 95% CI", "m*", "m* 95% CI",
                  "m* (% of n)", "AIC prefers", "note"],
                 [[f.regime, f.n, f.e_inf, f.amplitude, f.beta, f"[{ci_text(f.beta_ci)}]",
                   f.m_star, f"[{ci_text(f.m_star_ci)}]", pct(f.m_star, f.n), f.preferred,
                   f.reason or "ok"] for f in fitted.fits])


def gains(cells: list[CellEstimate]) -> list[dict[str, Any]]:
    """Seed-adjusted means at m = 10%, 40% and 100% of n (where swept), and the gains."""
    out = []
    for c in cells:
        at = {}
        for fraction in (0.1, 0.4, 1.0):
            m = max(1, round(fraction * c.n))
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


def range_verdict(alpha: float, ci: tuple[float, float],
                  allowed: tuple[float, float] = PAPER.alpha_range) -> str:
    """Where the fitted alpha and its 95% interval lie against the range the theory allows: the
    interval decides (inside it, outside it, or overlapping it: not decided by these runs)."""
    lo, hi = ci
    span = f"the range the theory allows ({allowed[0]:g} to {allowed[1]:g})"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"its interval is not identified, so these runs cannot place it against {span}"
    if allowed[0] <= lo and hi <= allowed[1]:
        return f"inside {span}"
    if hi < allowed[0] or lo > allowed[1]:
        return f"outside {span}, its whole interval included"
    where = "inside" if allowed[0] <= alpha <= allowed[1] else "outside"
    return (f"the point lies {where} {span} but its interval overlaps it: these runs neither "
            "confirm nor rule out the theory's range")


def comparison_text(cells: list[CellEstimate], laws: dict[str, ScalingLaw],
                    rows: list[dict[str, Any]], spec: MetricSpec) -> list[str]:
    """The comparison with the paper, in its units (points of the metric)."""
    out = [f"The paper: {PAPER.citation}. Its experiment: {PAPER.setting}. It reports gains of "
           f"{PAPER.gain_10_to_40_points[0]:g} to {PAPER.gain_10_to_40_points[1]:g} points from "
           f"m = 10% to 40% of n and at most {PAPER.gain_beyond_40_points:g} points beyond, so "
           f"m* ≈ {PAPER.saturation_fraction:g} n; its bounds put m* between sqrt(n) and n "
           f"(alpha from {PAPER.alpha_range[0]:g} to {PAPER.alpha_range[1]:g})."]
    first = [spec.points(g["gain_10_to_40"]) for g in rows if math.isfinite(g["gain_10_to_40"])]
    second = [spec.points(g["gain_40_to_100"]) for g in rows
              if math.isfinite(g["gain_40_to_100"])]
    if first and second:
        out.append(f"Here, in the same units ({spec.unit} of {spec.name}): {min(first):+.2f} to "
                   f"{max(first):+.2f} from 10% to 40% of n and {min(second):+.2f} to "
                   f"{max(second):+.2f} from 40% to 100%, over regimes and n.")
    else:
        out.append("The grid does not hold m = 10%, 40% and 100% of n for every n, so the "
                   "gains cannot be set beside the paper's.")
    located = [c.m_star / c.n for c in cells if c.status == "located"]
    if located:
        out.append(f"Where m* is located, m*/n ranges over {min(located):.2f} to "
                   f"{max(located):.2f} (the paper: about {PAPER.saturation_fraction:g}).")
    for regime, law in laws.items():
        if math.isfinite(law.alpha):
            out.append(f"Scaling ({regime}): alpha = {law.alpha:.2f} (95% CI "
                       f"{ci_text(law.alpha_ci)}), {range_verdict(law.alpha, law.alpha_ci)}.")
        else:
            out.append(f"Scaling ({regime}): not identified ({law.reason}).")
    out.append("Our scale is far below the paper's (thousands of anchors on a CPU, not millions "
               "on GPUs), and the model and data differ, so agreement in shape, not in the "
               "exact numbers, is what to look for.")
    return out


def headline(cells: list[CellEstimate], laws: dict[str, ScalingLaw],
             recs: list[dict[str, Any]], spec: MetricSpec, tolerance: float) -> str:
    """One alpha per regime with its interval, and the answer for the user's n."""
    if not cells:
        return "No finished runs to analyse."
    if all(c.status == "below" for c in cells):
        largest = spec.points(max(c.gain for c in cells))
        return (f"On this data and budget the number of negatives made no measurable "
                f"difference: in every (regime, n) the smallest swept m is within the tolerance "
                f"{tolerance:g} of the best (largest gain {largest:.2g} {spec.unit} of "
                f"{spec.name}), so m* <= the smallest swept m everywhere. If the metric is near "
                "chance, train longer or choose a metric the model can move.")
    parts = []
    for regime in REGIMES:
        law = laws.get(regime)
        if law is None:
            continue
        if math.isfinite(law.alpha):
            parts.append(f"{regime}: m* ~ n^{law.alpha:.2f} (95% CI {ci_text(law.alpha_ci)})")
        else:
            parts.append(f"{regime}: m*(n) not identified ({law.reason})")
    text = f"How many negatives this data can use (within {tolerance:g} of the best " \
           f"{spec.name}): " + "; ".join(parts) + "."
    answers = [recommendation_text(r) for r in recs if math.isfinite(r["m"])]
    if answers:
        text += " " + " ".join(answers)
    ratios = [c.m_star / c.n for c in cells if c.status == "located"]
    if ratios:
        text += f" Located cells put m* at {np.min(ratios):.0%} to {np.max(ratios):.0%} of n."
    return text
