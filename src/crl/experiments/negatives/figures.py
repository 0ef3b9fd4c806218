"""The figures of ``crl study negatives``; every m axis is in % of n."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from crl.experiments import plots
from crl.experiments.negatives.curves import CurveCell
from crl.experiments.negatives.laws import LawFit
from crl.experiments.negatives.paper import PAPER
from crl.experiments.negatives.stats import REGIMES
from crl.experiments.study import Figure


def plot_curves(rows: list[dict[str, Any]], cells: list[CurveCell], metric: str,
                higher: bool, baseline: float | None, study_dir: Path, *,
                baseline_label: str) -> Figure:
    """The metric against m/n (%) per n, one panel per regime, with the fitted curve m* is read
    from (dashed), the m* intervals shaded, and the baseline (the model before training) as a
    dashed black line when there is one."""
    regimes = [r for r in REGIMES if any(row.get("regime") == r for row in rows)]
    fig, axes = plots.subplots(max(1, len(regimes)))
    ns = sorted({int(r["n"]) for r in rows})
    for ax, regime in zip(axes, regimes, strict=False):
        for color, n in zip(plots.COLORS, ns, strict=False):
            sub = [{**r, "_percent": 100.0 * float(r["m"]) / n} for r in rows
                   if r.get("regime") == regime and r.get("n") == n]
            plots.errorbar_series(ax, sub, "_percent", metric, label=f"n = {n:,}", color=color)
            cell = next((c for c in cells if c.regime == regime and c.n == n), None)
            if cell is None:
                continue
            sign = 1.0 if higher else -1.0  # the cells hold oriented scores
            ax.plot([100 * m / n for m in cell.ms], [sign * v for v in cell.fitted], "--",
                    color=color, lw=1)
            if cell.m_star is not None:
                ax.axvspan(100 * cell.lower / n, 100 * cell.upper / n, color=color, alpha=0.08)
        if baseline is not None:
            ax.axhline(baseline, color="black", ls="--", lw=1, label="before training")
        ax.axvline(100 * PAPER.saturation_fraction, color="grey", ls=":", lw=1,
                   label=f"m = {100 * PAPER.saturation_fraction:.0f}% of n (paper)")
        ax.set_title(f"{regime} negatives")
        plots.style(ax, "negatives per anchor m (% of n)", f"{metric} (held-out)")
    return plots.finish(fig, study_dir, "metric_vs_m.png", f"{metric} against m in % of n for "
                        "each n (log axis), both regimes; points are means over seeds with "
                        "their standard deviation, dashed lines the fitted curves m* is read "
                        "from, shaded bands the m* intervals of located cells"
                        + ("" if baseline is None else
                           f"; the dashed black line is {baseline_label}") + ".")


def plot_m_star(cells: list[CurveCell], laws: dict[str, LawFit], study_dir: Path) -> Figure:
    """m*/n (%) against n with the laws, and each cell's residual from its regime's law."""
    fig, axes = plots.subplots(2, width=6.0)
    ax, res = axes[0], axes[1]
    all_n = np.array(sorted({float(c.n) for c in cells})) if cells else np.array([1.0])
    line = np.geomspace(all_n.min(), all_n.max(), 50)
    for color, regime in zip(plots.COLORS, REGIMES, strict=False):
        mine = [c for c in cells if c.regime == regime]
        for c in mine:
            if c.m_star is not None:
                y, lo, hi = (100 * v / c.n for v in (c.m_star, c.lower, c.upper))
                ax.errorbar([c.n], [y], yerr=[[max(y - lo, 0)], [max(hi - y, 0)]], fmt="o",
                            color=color, capsize=3)
            else:
                bound = c.lower if c.status == "above" else c.upper
                if bound > 0 and math.isfinite(bound):
                    ax.plot([c.n], [100 * bound / c.n], "^" if c.status == "above" else "v",
                            color=color, mfc="white")
        law = laws.get(regime)
        if law is not None and law.alpha is not None and law.intercept is not None:
            ax.plot(line, 100 * np.exp(law.intercept) * line ** (law.alpha - 1),
                    "-" if law.verdict == "fits" else ":", color=color, alpha=0.7,
                    label=f"{regime}: alpha = {law.alpha:.2f} ({law.verdict})")
            ns, rs = zip(*law.residuals, strict=True)
            res.plot(ns, rs, "o-", color=color, label=regime)
        if mine:
            ax.plot([], [], "o", color=color, label=f"{regime}: m* (95% interval)")
    ax.plot(line, np.full_like(line, 100 * PAPER.saturation_fraction), "k:", lw=1,
            label="m = 40% of n (paper)")
    ax.plot(line, 100 / np.sqrt(line), "k-.", lw=1, label="m = sqrt(n)")
    for axis in (ax, res):
        axis.set_xscale("log")
        axis.set_xlabel("anchors n")
        axis.grid(alpha=0.3, which="both")
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7, loc="lower left", framealpha=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("critical negatives m* (% of n)")
    res.axhline(0.0, color="grey", lw=1)
    res.set_ylabel("residual from the law (sd)")
    return plots.finish(fig, study_dir, "m_star_vs_n.png", "Left: m* in % of n against n "
                        "(log-log): located cells with their 95% intervals (dots), censored "
                        "cells as open triangles at their bound (up: m* at least there; down: "
                        "at most), the fitted m*(n) laws (solid where the law fits, dotted "
                        "where it does not), and the references m = 40% of n and m = sqrt(n). "
                        "Right: each cell's standardised residual from its regime's law.")


def plot_regimes(rows: list[dict[str, Any]], metric: str, study_dir: Path) -> Figure:
    """Independent minus shared at equal m and seed, against m/n (%)."""
    fig, axes = plots.subplots(1, width=6.0)
    ax = axes[0]
    ns = sorted({int(r["n"]) for r in rows})
    for color, n in zip(plots.COLORS, ns, strict=False):
        diffs: dict[float, list[float]] = {}
        keyed = {(r.get("regime"), r.get("m"), r.get("seed")): r.get(metric)
                 for r in rows if r.get("n") == n}
        for (regime, m, seed), value in keyed.items():
            other = keyed.get(("shared", m, seed))
            if regime == "independent" and isinstance(m, (int, float)) \
                    and isinstance(value, float) and isinstance(other, float):
                diffs.setdefault(float(m) / n * 100, []).append(value - other)
        if diffs:
            xs = sorted(diffs)
            ax.errorbar(xs, [np.mean(diffs[x]) for x in xs],
                        yerr=[np.std(diffs[x]) for x in xs], fmt="o-", color=color,
                        capsize=3, label=f"n = {n:,}")
    ax.axhline(0.0, color="grey", lw=1)
    plots.style(ax, "negatives per anchor m (% of n)", f"{metric}: independent - shared")
    return plots.finish(fig, study_dir, "independent_minus_shared.png", "Independent minus "
                        "shared negatives at equal m and seed, against m in % of n.")
