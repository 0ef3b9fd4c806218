"""The analysis of ``crl study negatives``: m*(n) on the grid and from the power-law fit, the
plots, the tables and the plain-words comparison with the paper (THEORY.md section 6)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from crl.errors import CrlValueError
from crl.experiments import plots
from crl.experiments.study import Analysis, Figure, Section, Table
from crl.theory.scaling import CriticalMResult, PowerLawFit, fit_critical_m

REGIMES = ("shared", "independent")


def build_analysis(rows: list[dict[str, Any]], study_dir: Path, *, metric: str,
                   tolerance: float, preset: str, setup: str) -> Analysis:
    """The report sections and key numbers of a negatives study from its result rows (which
    must hold ``metric``); figures go to ``study_dir/plots``."""
    higher = _higher_is_better(metric)
    fitted = fit_critical_m(rows, tolerance, metric=metric, higher_is_better=higher,
                            num_bootstrap=300, seed=0)
    grid = grid_saturation(rows, metric, tolerance, higher)
    theory = _theory_check(study_dir, preset)
    figures = [
        _plot_curves(rows, fitted, metric, higher, study_dir),
        _plot_m_star(fitted, grid, study_dir),
        _plot_regimes(rows, metric, study_dir),
    ]
    gains = _gains(rows, metric)
    numbers = {"critical_m": fitted.to_dict(), "grid_saturation": grid,
               "theory_inner_error": theory, "gains": gains, "metric": metric,
               "tolerance": tolerance}
    sections = [
        Section("Set-up", [setup]),
        Section("Metric against the number of negatives", [
            f"Each point is the mean over seeds of {metric} on the held-out test pairs; "
            "error bars are the standard deviation over seeds; lines are the fitted "
            "E_inf + A m^-beta (in error units).",
        ], figures=[figures[0], figures[2]]),
        Section("Where the gains stop: m* on the grid", [_grid_text(grid, tolerance)],
                tables=[_grid_table(grid), _grid_alpha_table(grid)], figures=[figures[1]]),
        Section("Critical number of negatives from the power-law fit",
                [_m_star_text(fitted, tolerance)],
                tables=[_fit_table(fitted), _alpha_table(fitted)]),
        Section("Gains along m (the paper's comparison)", [_gains_text(gains)],
                tables=[_gains_table(gains)]),
        Section("Inner error: 1/m against 1/sqrt(m)", [_theory_text(theory, fitted)]),
        Section("Comparison with the paper", _comparison_text(grid, fitted, gains)),
    ]
    return Analysis(_headline(grid), sections, numbers)


def _higher_is_better(metric: str) -> bool:
    lowered = metric.lower()
    return not any(key in lowered for key in ("loss", "risk", "rank", "error"))


def _theory_check(study_dir: Path, preset: str) -> dict[str, Any]:
    """Inner-error rates on an exact tabular model at a fixed mild scorer (cached in the study
    directory, so reports stay rebuildable from files)."""
    path = study_dir / "theory_check.json"
    if path.exists():
        cached: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return cached
    import torch

    from crl.rundir import write_json
    from crl.theory import TabularModel, fit_rate, inner_outer_error

    rng = np.random.default_rng(12)
    model = TabularModel([0.3, 0.7], rng.dirichlet(np.ones(6), size=2))
    table = 0.5 * rng.normal(size=(2, 6))
    small = preset == "smoke"
    ms = [8, 32, 128] if small else [8, 16, 32, 64, 128]
    out: dict[str, Any] = {"model": "a random 2 x 6 tabular model, scores 0.5 N(0, 1)",
                           "tau": 1.0, "m": ms}
    # Independent negatives: n >> m, the RMS is the 1/m bias. Shared: the fluctuation of the one
    # shared sample, 1/sqrt(m), which repetitions must resolve.
    settings = {"independent": (2000 if small else 20_000, 3 if small else 6),
                "shared": (400 if small else 800, 10 if small else 80)}
    for key, (n, repetitions) in settings.items():
        generator = torch.Generator().manual_seed(0 if key == "independent" else 1)
        rms = [inner_outer_error(model, table, 1.0, n=n, m=m, shared=key == "shared",
                                 repetitions=repetitions, generator=generator).inner_rms
               for m in ms]
        rate = fit_rate(ms, rms)
        out[key] = {"n": n, "repetitions": repetitions, "inner_rms": rms,
                    "exponent": rate.exponent, "ci": [rate.low, rate.high]}
    write_json(path, out)
    return out


def _cell_means(rows: list[dict[str, Any]], metric: str, higher: bool
                ) -> dict[tuple[str, int], dict[int, list[float]]]:
    """Per (regime, n), per m: the metric of each seed, as a score (higher is better)."""
    cells: dict[tuple[str, int], dict[int, list[float]]] = {}
    for r in rows:
        value = r.get(metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        score = float(value) if higher else -float(value)
        cells.setdefault((str(r["regime"]), int(r["n"])), {}).setdefault(int(r["m"]), []) \
            .append(score)
    return cells


def _saturation_point(by_m: dict[int, list[float]], tolerance: float) -> tuple[int, int]:
    """(smallest m whose mean is within ``tolerance`` of the best mean, the best m)."""
    means = {m: float(np.mean(v)) for m, v in by_m.items()}
    best_m = max(means, key=lambda m: means[m])
    m_star = min(m for m, v in means.items() if v >= means[best_m] - tolerance)
    return m_star, best_m


def _slope(n: np.ndarray, m: np.ndarray) -> tuple[float, float]:
    slope, intercept = np.polyfit(np.log(n), np.log(m), 1)
    return float(slope), float(intercept)


def grid_saturation(rows: list[dict[str, Any]], metric: str, tolerance: float, higher: bool,
                    *, num_bootstrap: int = 500, seed: int = 0) -> dict[str, Any]:
    """Model-free saturation: per (regime, n) the smallest swept ``m`` whose seed-mean metric is
    within ``tolerance`` of the best swept ``m``, with a bootstrap interval over seeds; per regime
    the slope ``alpha`` of ``log m*`` against ``log n`` (free intercept) with its interval.

    A cell is ``flat`` when the best swept ``m`` beats the smallest by no more than ``tolerance``
    (``gain``): more negatives made no measurable difference there, so its ``m*`` (the smallest
    ``m``) says nothing about where gains stop. Flat cells are left out of ``alpha``.

    Example:
        >>> rows = [{"regime": "shared", "n": n, "m": m, "seed": s, "score": min(m / n, 0.4)}
        ...         for n in (100, 200, 400) for m in (10, 40, 100) if m <= n for s in (0, 1)]
        >>> out = grid_saturation(rows, "score", 0.01, True, num_bootstrap=20)
        >>> [(c["n"], c["m_star"]) for c in out["cells"]]
        [(100, 40), (200, 100), (400, 100)]
    """
    rng = np.random.default_rng(seed)
    cells = _cell_means(rows, metric, higher)
    out_cells: list[dict[str, Any]] = []
    for (regime, n), by_m in sorted(cells.items()):
        m_star, best_m = _saturation_point(by_m, tolerance)
        draws = []
        for _ in range(num_bootstrap):
            resampled = {m: list(rng.choice(v, size=len(v))) for m, v in by_m.items()}
            draws.append(_saturation_point(resampled, tolerance)[0])
        means = {m: float(np.mean(v)) for m, v in by_m.items()}
        gain = means[best_m] - means[min(means)]  # in score units: >= 0
        out_cells.append({
            "regime": regime, "n": n, "m_star": m_star, "m_star_over_n": m_star / n,
            "gain": gain, "flat": gain <= tolerance,
            "m_star_ci": [float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))],
            "best_m": best_m, "best": means[best_m] if higher else -means[best_m],
            "at_m_star": means[m_star] if higher else -means[m_star],
            "_draws": draws})
    regimes: dict[str, Any] = {}
    for regime in sorted({c["regime"] for c in out_cells}):
        mine = [c for c in out_cells if c["regime"] == regime and not c["flat"]]
        if len({c["n"] for c in mine}) < 2:
            continue
        anchors = np.array([c["n"] for c in mine], dtype=float)
        alpha, intercept = _slope(anchors, np.array([c["m_star"] for c in mine], dtype=float))
        boot = [_slope(anchors, np.array([c["_draws"][b] for c in mine], dtype=float))[0]
                for b in range(num_bootstrap)]
        regimes[regime] = {"alpha": alpha, "intercept": intercept,
                           "alpha_ci": [float(np.percentile(boot, 2.5)),
                                        float(np.percentile(boot, 97.5))]}
    for c in out_cells:
        del c["_draws"]
    return {"metric": metric, "tolerance": tolerance, "cells": out_cells, "regimes": regimes}


def _grid_table(grid: dict[str, Any]) -> Table:
    return Table(f"Saturation on the grid (within {grid['tolerance']:g} of the best m)",
                 ["regime", "n", "m*", "m* 95% CI (seeds)", "m*/n", "metric at m*",
                  "best m", "best metric", "gain over the smallest m"],
                 [[c["regime"], c["n"], c["m_star"], f"[{plots_ci(tuple(c['m_star_ci']))}]",
                   c["m_star_over_n"], c["at_m_star"], c["best_m"], c["best"],
                   f"{c['gain']:.3f}" + (" (flat)" if c["flat"] else "")]
                  for c in grid["cells"]])


def _grid_alpha_table(grid: dict[str, Any]) -> Table:
    return Table("log m* = alpha log n + c on the grid m* (free intercept)",
                 ["regime", "alpha", "alpha 95% CI (seeds)", "c"],
                 [[r, v["alpha"], f"[{plots_ci(tuple(v['alpha_ci']))}]", v["intercept"]]
                  for r, v in grid["regimes"].items()])


def _grid_text(grid: dict[str, Any], tolerance: float) -> str:
    parts = [f"For each regime and n, m* is the smallest swept m whose mean metric over seeds is "
             f"within {tolerance:g} of the best swept m; its interval resamples the seeds. It "
             "needs no model of the curve, but it can only take the swept values."]
    for c in grid["cells"]:
        if c["flat"]:
            parts.append(f"{c['regime']}, n = {c['n']}: flat, the best m ({c['best_m']}, "
                         f"metric {c['best']:.3f}) beats the smallest by only {c['gain']:.3f}, "
                         "within the tolerance, so this cell does not locate m*.")
            continue
        parts.append(f"{c['regime']}, n = {c['n']}: m* = {c['m_star']} "
                     f"({100 * c['m_star_over_n']:.0f}% of n; metric {c['at_m_star']:.3f} "
                     f"against the best {c['best']:.3f} at m = {c['best_m']}).")
    return " ".join(parts)


def _curve(fit: PowerLawFit, higher: bool) -> Any:
    if not all(math.isfinite(v) for v in (fit.e_inf, fit.amplitude, fit.beta)):
        return None

    def curve(m: np.ndarray) -> np.ndarray:
        err = fit.e_inf + fit.amplitude * m ** (-fit.beta)
        return 1.0 - err if higher else err

    return curve


def _plot_curves(rows: list[dict[str, Any]], fitted: CriticalMResult, metric: str,
                 higher: bool, study_dir: Path) -> Figure:
    regimes = [r for r in REGIMES if any(row.get("regime") == r for row in rows)]
    fig, axes = plots.subplots(max(1, len(regimes)))
    ns = sorted({int(r["n"]) for r in rows})
    for ax, regime in zip(axes, regimes, strict=False):
        for color, n in zip(plots.COLORS, ns, strict=False):
            sub = [r for r in rows if r.get("regime") == regime and r.get("n") == n]
            try:
                curve = _curve(fitted.fit(regime, float(n)), higher)
            except CrlValueError:
                curve = None
            scaled = None if curve is None else (lambda f, c=curve, n=n: c(f * n))
            for r in sub:
                r["_fraction"] = float(r["m"]) / n
            plots.errorbar_series(ax, sub, "_fraction", metric, label=f"n = {n}", color=color,
                                  x_scale=100.0, curve=scaled)
        ax.set_xscale("log")
        ax.set_xlabel("negatives per anchor m / n (%)")
        ax.set_ylabel(f"{metric} (held-out)")
        ax.set_title(f"{regime} negatives")
        ax.axvline(40.0, color="grey", ls=":", lw=1, label="m = 0.4 n (paper)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    path = Path("plots") / "metric_vs_m.png"
    plots.save(fig, study_dir / path)
    return Figure(str(path), f"{metric} against m/n for each n (log axis), both regimes.")


def _plot_m_star(fitted: CriticalMResult, grid: dict[str, Any], study_dir: Path) -> Figure:
    fig, axes = plots.subplots(1, width=6.0)
    ax = axes[0]
    for color, regime in zip(plots.COLORS, REGIMES, strict=False):
        cells = [c for c in grid["cells"] if c["regime"] == regime]
        if cells:
            gn = np.array([c["n"] for c in cells], dtype=float)
            gm = np.array([c["m_star"] for c in cells], dtype=float)
            lo = np.array([c["m_star_ci"][0] for c in cells])
            hi = np.array([c["m_star_ci"][1] for c in cells])
            ax.errorbar(gn * 1.03, gm, yerr=[np.maximum(gm - lo, 0), np.maximum(hi - gm, 0)],
                        fmt="s", color=color, mfc="white", capsize=3,
                        label=f"{regime}: m* on the grid")
            scaling = grid["regimes"].get(regime)
            if scaling is not None:
                line = np.geomspace(gn.min(), gn.max(), 50)
                ax.plot(line, np.exp(scaling["intercept"]) * line ** scaling["alpha"], "--",
                        color=color, alpha=0.7,
                        label=f"{regime} (grid): alpha = {scaling['alpha']:.2f}")
        fits = [f for f in fitted.fits if f.regime == regime and math.isfinite(f.m_star)
                and not f.extrapolated]
        if not fits:
            continue
        n = np.array([f.n for f in fits])
        ms = np.array([f.m_star for f in fits])
        lo = np.array([f.m_star_ci[0] if math.isfinite(f.m_star_ci[0]) else f.m_star
                       for f in fits])
        hi = np.array([f.m_star_ci[1] if math.isfinite(f.m_star_ci[1]) else f.m_star
                       for f in fits])
        ax.errorbar(n, ms, yerr=[np.maximum(ms - lo, 0), np.maximum(hi - ms, 0)], fmt="o",
                    color=color, capsize=3, label=f"{regime}: m* of the power-law fit")
        scaling = fitted.regimes.get(regime)
        if scaling is not None and math.isfinite(scaling.alpha) and len(fits) >= 2:
            line = np.geomspace(n.min(), n.max(), 50)
            ax.plot(line, np.exp(scaling.intercept) * line ** scaling.alpha, "-", color=color,
                    alpha=0.7, label=f"{regime} (fit): alpha = {scaling.alpha:.2f}")
    all_n = np.array(sorted({float(c["n"]) for c in grid["cells"]}))
    if all_n.size:
        line = np.geomspace(all_n.min(), all_n.max(), 50)
        ax.plot(line, 0.4 * line, "k:", lw=1, label="m = 0.4 n (paper)")
        ax.plot(line, np.sqrt(line), "k-.", lw=1, label="m = sqrt(n)")
        ax.plot(line, line, color="grey", lw=0.8, label="m = n")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("anchors n")
    ax.set_ylabel("critical negatives m*(n)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", framealpha=0.8)
    path = Path("plots") / "m_star_vs_n.png"
    plots.save(fig, study_dir / path)
    return Figure(str(path), "m*(n) on log-log axes: the grid saturation point (squares, "
                  "intervals from the seeds) and the power-law fit's m* where it lies inside the "
                  "swept range (dots), the fitted lines, and the references m = 0.4 n, "
                  "m = sqrt(n) and m = n.")


def _plot_regimes(rows: list[dict[str, Any]], metric: str, study_dir: Path) -> Figure:
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
                        capsize=3, label=f"n = {n}")
    ax.axhline(0.0, color="grey", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("negatives per anchor m / n (%)")
    ax.set_ylabel(f"{metric}: independent - shared")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = Path("plots") / "independent_minus_shared.png"
    plots.save(fig, study_dir / path)
    return Figure(str(path), "Independent minus shared negatives at equal m (same seed).")


def _fit_table(fitted: CriticalMResult) -> Table:
    rows = []
    for f in fitted.fits:
        rows.append([f.regime, f.n, f.e_inf, f.amplitude, f.beta,
                     f"[{plots_ci(f.beta_ci)}]", f.m_star, f"[{plots_ci(f.m_star_ci)}]",
                     f.m_star_over_n, f.preferred, f.reason or "ok"])
    return Table("Per-n fits of err(m) = E_inf + A m^-beta",
                 ["regime", "n", "E_inf", "A", "beta", "beta 95% CI", "m*", "m* 95% CI",
                  "m*/n", "AIC prefers", "note"], rows)


def _alpha_table(fitted: CriticalMResult) -> Table:
    rows = []
    for s in fitted.regimes.values():
        outside = sum(1 for f in fitted.fits if f.regime == s.regime and f.extrapolated)
        note = s.reason or ("ok" if not outside else
                            f"unreliable: {outside} m* beyond the swept range")
        rows.append([s.regime, s.alpha, f"[{plots_ci(s.alpha_ci)}]", s.intercept, note])
    return Table("log m* = alpha log n + c (free intercept)",
                 ["regime", "alpha", "alpha 95% CI", "c", "note"], rows)


def plots_ci(ci: tuple[float, float]) -> str:
    """An interval as text, with dashes for missing ends."""
    return ", ".join(f"{v:.3g}" if math.isfinite(v) else "—" for v in ci)


def _gains(rows: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """Mean metric at m/n = 10%, 40%, 100% per (regime, n), and the gains between them."""
    out = []
    for regime in REGIMES:
        for n in sorted({int(r["n"]) for r in rows}):
            means = {}
            for fraction in (0.1, 0.4, 1.0):
                values = [float(r[metric]) for r in rows
                          if r.get("regime") == regime and r.get("n") == n
                          and abs(float(r["m_fraction"]) - fraction) < 1e-9
                          and isinstance(r.get(metric), (int, float))]
                means[fraction] = float(np.mean(values)) if values else float("nan")
            out.append({"regime": regime, "n": n, "at_10": means[0.1], "at_40": means[0.4],
                        "at_100": means[1.0], "gain_10_to_40": means[0.4] - means[0.1],
                        "gain_40_to_100": means[1.0] - means[0.4]})
    return out


def _gains_table(gains: list[dict[str, Any]]) -> Table:
    return Table("Metric at m/n = 10%, 40% and 100%",
                 ["regime", "n", "10%", "40%", "100%", "gain 10→40%", "gain 40→100%"],
                 [[g["regime"], g["n"], g["at_10"], g["at_40"], g["at_100"],
                   g["gain_10_to_40"], g["gain_40_to_100"]] for g in gains])


def _gains_text(gains: list[dict[str, Any]]) -> str:
    first = [g["gain_10_to_40"] for g in gains if math.isfinite(g["gain_10_to_40"])]
    second = [g["gain_40_to_100"] for g in gains if math.isfinite(g["gain_40_to_100"])]
    if not first or not second:
        return "The grid does not contain m/n = 10%, 40% and 100% for every n."
    return (f"From m = 10% to 40% of n the metric changes by {min(first):+.3f} to "
            f"{max(first):+.3f}; from 40% to 100% by {min(second):+.3f} to {max(second):+.3f} "
            "(over regimes and n). The paper reports gains of 7.6 to 20 points from 10% to 40% "
            "and at most 1.4 points beyond 40%.")


def _m_star_text(fitted: CriticalMResult, tolerance: float) -> str:
    parts = [f"m*(n; delta) is the smallest m whose fitted error is within delta = {tolerance:g} "
             "of the fitted asymptote E_inf; intervals are 95% residual-bootstrap intervals."]
    for f in fitted.fits:
        if math.isfinite(f.m_star) and f.extrapolated:
            parts.append(f"{f.regime}, n = {f.n:g}: the fitted m* ({f.m_star:.3g}) lies beyond "
                         "the largest swept m, so the fit does not locate it.")
        elif math.isfinite(f.m_star):
            parts.append(f"{f.regime}, n = {f.n:g}: m* = {f.m_star:.3g} "
                         f"({100 * f.m_star_over_n:.1f}% of n).")
        else:
            parts.append(f"{f.regime}, n = {f.n:g}: m* not identified ({f.reason}).")
    return " ".join(parts)


def _theory_text(theory: dict[str, Any], fitted: CriticalMResult) -> str:
    parts = []
    for regime, expected in (("independent", 1.0), ("shared", 0.5)):
        betas = [f.beta for f in fitted.fits if f.regime == regime and math.isfinite(f.beta)]
        exact = theory.get(regime, {})
        if betas:
            parts.append(f"On this data, the fitted decay exponents beta of the {regime} "
                         f"regime range over {min(betas):.2f} to {max(betas):.2f}.")
        if exact:
            lo, hi = exact["ci"]
            parts.append(f"On an exact model ({theory['model']}, n = {exact['n']}), the "
                         f"inner-error RMS of the {regime} regime falls "
                         f"like m^-{exact['exponent']:.2f} (95% CI {lo:.2f} to {hi:.2f}; theory: "
                         f"{expected:g}).")
    parts.append("The beta of a trained model mixes the inner error with optimisation and the "
                 "outer error, so it need not equal the theoretical rate; the exact model "
                 "isolates the inner error.")
    return " ".join(parts)


def _comparison_text(grid: dict[str, Any], fitted: CriticalMResult,
                     gains: list[dict[str, Any]]) -> list[str]:
    out = []
    ratios = [c["m_star_over_n"] for c in grid["cells"] if not c["flat"]]
    if not ratios and grid["cells"]:
        out.append("Saturation: no comparison with the paper's m* ≈ 0.4 n is possible, since "
                   "more negatives made no difference beyond the tolerance in any cell.")
    if ratios:
        median = float(np.median(ratios))
        verdict = "close to" if 0.2 <= median <= 0.7 else "unlike"
        out.append(f"Saturation: gains stop (within the tolerance) at a median m*/n of "
                   f"{median:.2f} over regimes and n (range {min(ratios):.2f} to "
                   f"{max(ratios):.2f}), {verdict} the paper's m* ≈ 0.4 n.")
    first = [g["gain_10_to_40"] for g in gains if math.isfinite(g["gain_10_to_40"])]
    second = [g["gain_40_to_100"] for g in gains if math.isfinite(g["gain_40_to_100"])]
    if first and second:
        out.append(f"Gains: {np.mean(first):+.3f} on average from 10% to 40% of n, "
                   f"{np.mean(second):+.3f} from 40% to 100% (the paper: 7.6 to 20 points, then "
                   "at most 1.4).")
    for regime, v in grid["regimes"].items():
        inside = 0.5 <= v["alpha"] <= 1.0
        out.append(f"Scaling ({regime}, grid m*): alpha = {v['alpha']:.2f} "
                   f"(95% CI {plots_ci(tuple(v['alpha_ci']))}), "
                   + ("inside" if inside else "outside")
                   + " the range 0.5 to 1 that the theory allows (sqrt(n) to n). With three "
                   "values of n and m* restricted to the swept fractions, this exponent is "
                   "coarse.")
    for regime, s in fitted.regimes.items():
        outside = any(f.extrapolated for f in fitted.fits if f.regime == regime)
        if math.isfinite(s.alpha) and outside:
            out.append(f"Scaling ({regime}, power-law fit): not reliable, some fitted m* lie "
                       "beyond the swept range.")
        elif math.isfinite(s.alpha):
            out.append(f"Scaling ({regime}, power-law fit): alpha = {s.alpha:.2f} "
                       f"(95% CI {plots_ci(s.alpha_ci)}).")
        else:
            out.append(f"Scaling ({regime}, power-law fit): not identified ({s.reason}).")
    out.append("Our scale is far below the paper's (thousands of anchors on a CPU, not millions "
               "on GPUs), and our model and data differ, so agreement in shape, not in the exact "
               "numbers, is what to look for.")
    return out


def _headline(grid: dict[str, Any]) -> str:
    cells = grid["cells"]
    if not cells:
        return "No finished runs to analyse."
    tolerance = grid["tolerance"]
    informative = [c for c in cells if not c["flat"]]
    if not informative:
        values = [c["best"] for c in cells] + [c["at_m_star"] for c in cells]
        return (f"On this data and budget the number of negatives made no measurable difference: "
                f"in every (regime, n) the best m beats the smallest by at most "
                f"{max(c['gain'] for c in cells):.3f}, within the tolerance {tolerance:g}, so m* "
                f"cannot be located ({grid.get('metric', 'the metric')} ranges "
                f"{min(values):.3f} to {max(values):.3f}). If that is near chance, train longer "
                "or choose a metric the model can move (e.g. --metric probe/knn_acc on labelled "
                "data).")
    parts = []
    for regime in REGIMES:
        mine = [c for c in informative if c["regime"] == regime]
        if mine:
            parts.append(f"{regime}: " + ", ".join(
                f"{100 * c['m_star_over_n']:.0f}% at n = {c['n']}" for c in mine))
    ratios = [c["m_star_over_n"] for c in informative]
    text = (f"How many negatives this data can use: gains stop within "
            f"{tolerance:g} of the best at m* ≈ {np.median(ratios):.2f} n "
            f"(median; {'; '.join(parts)}).")
    flat = [c for c in cells if c["flat"]]
    if flat:
        text += (" No measurable gain from more negatives in " + ", ".join(
            f"{c['regime']} n = {c['n']}" for c in flat) + " (left out).")
    alphas = {r: v["alpha"] for r, v in grid["regimes"].items()}
    if alphas:
        text += " m* grows like n^alpha with " + ", ".join(
            f"alpha = {a:.2f} ({r})" for r, a in alphas.items()) + "."
    return text
