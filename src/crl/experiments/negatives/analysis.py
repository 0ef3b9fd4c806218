"""The analysis of ``crl study negatives``: statistics (:mod:`.stats`), figures
(:mod:`.figures`) and words (:mod:`.text`) put together into the report's
sections and ``analysis.json`` (docs/negatives.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crl.experiments.metrics import MetricSpec
from crl.experiments.negatives import text
from crl.experiments.negatives.figures import plot_curves, plot_m_star, plot_regimes
from crl.experiments.negatives.setup import UNTRAINED
from crl.experiments.negatives.stats import REGIMES, ScalingLaw, estimate_cells, fit_law
from crl.experiments.negatives.theory import theory_check, theory_text
from crl.experiments.study import Analysis, Section, Table
from crl.theory.scaling import fit_critical_m


@dataclass
class StudyFacts:
    """What the analysis needs to know beyond the result rows.

    Attributes:
        setup: The set-up section (sentences and tables, written by the study).
        target_n: The n to recommend m for (the user's whole training split by default).
        test_size: Pairs in the held-out test split every run is evaluated on.
        baseline: The metric of the model before training (the frozen or zero-shot baseline
            for a pretrained backbone), None when not measured.
        baseline_label: What that model is, in words.
        added: The runs the refinement added: ``{"stage", "regime", "n", "m", "seed",
            "reason"}``.
    """

    setup: Section
    target_n: int
    test_size: int | None = None
    baseline: float | None = None
    baseline_label: str = UNTRAINED
    added: list[dict[str, Any]] = field(default_factory=list)


def _refinement_section(added: list[dict[str, Any]]) -> Section:
    if not added:
        return Section("Refinement", ["The refinement stage added no runs (no cell needed "
                                      "them, or its run budget was 0)."])
    groups: dict[tuple[Any, ...], list[int]] = {}
    for a in added:
        groups.setdefault((a["stage"], a["regime"], a["n"], a["m"], a["reason"]), []) \
            .append(int(a["seed"]))
    rows = [[stage, regime, n, m, text.pct(m, n), ", ".join(map(str, sorted(seeds))), reason]
            for (stage, regime, n, m, reason), seeds in sorted(groups.items())]
    runs = len({(a["regime"] if a["m"] < a["n"] - 1 else "shared", a["n"], a["m"], a["seed"])
                for a in added})
    return Section("Refinement", [
        f"Where a cell's m* interval spanned more than one step of its swept m, a second stage "
        f"added runs at m between the bracketing values (with every seed the cell had), and one "
        f"more seed where the seeds disagreed; {runs} distinct runs were added."],
        tables=[Table("Runs added by the refinement", ["stage", "regime", "n", "m",
                                                       "m (% of n)", "seeds", "why"], rows)])


def build_analysis(rows: list[dict[str, Any]], study_dir: Path, *, spec: MetricSpec,
                   tolerance: float, preset: str, facts: StudyFacts) -> Analysis:
    """The report sections and key numbers of a negatives study from its result rows (which
    must hold ``spec.name``); figures go to ``study_dir/plots``."""
    metric, higher = spec.name, spec.higher_is_better
    cells = estimate_cells(rows, metric, higher, tolerance)
    regimes = [r for r in REGIMES if any(c.regime == r for c in cells)]
    laws: dict[str, ScalingLaw] = {r: fit_law(r, cells) for r in regimes}
    ns = [c.n for c in cells]
    swept = (min(ns), max(ns)) if ns else (0, 0)
    recs = [text.recommendation(law, facts.target_n, swept) for law in laws.values()]
    fitted = fit_critical_m(rows, tolerance, metric=metric, higher_is_better=higher,
                            num_bootstrap=300, seed=0, error_bounds=spec.error_bounds())
    theory = theory_check(study_dir, preset)
    gains = text.gains(cells)
    curves = plot_curves(rows, cells, metric, facts.baseline, study_dir,
                         baseline_label=facts.baseline_label)
    m_star_figure = plot_m_star(cells, laws, study_dir)
    regime_figure = plot_regimes(rows, metric, study_dir)
    evaluation = (f"Every run is evaluated on the same {facts.test_size:,} held-out test pairs."
                  if facts.test_size else "Every run is evaluated on the same held-out pairs.")
    baseline = ("" if facts.baseline is None else
                f" The dashed line is the baseline, {facts.baseline_label} ({metric} = "
                f"{facts.baseline:.3f}).")
    sections = [
        facts.setup,
        Section("The answer for your n", [text.recommendation_text(r) for r in recs]
                + [text.goal_text(cells)], tables=[text.law_table(laws, recs)]),
        Section("Metric against the number of negatives", [
            f"Each point is the mean over seeds of {spec.description} ({metric}) against m in % "
            f"of n; error bars are the standard deviation over seeds. {evaluation}{baseline}"],
            figures=[curves, regime_figure]),
        Section("Where the gains stop: m* per (regime, n)", [
            "For each regime and n, m* is the smallest swept m whose mean over seeds is within "
            f"{tolerance:g} of the best swept m. Runs with the same seed share the initialisation "
            "and data order across m, so the comparison is paired: the mean per m is adjusted "
            "for each seed's level and the interval resamples whole seeds. The true m* lies "
            "above the swept m below the grid m*, so intervals start there. A cell is censored "
            "when the sweep only bounds m*: not saturated (gains still rising into the largest "
            "swept m), which enters the alpha fit as a lower bound, never as a point; or "
            "saturated at the smallest swept m (m did not move the metric beyond the "
            "tolerance), which the alpha fit leaves out.", text.goal_text(cells)],
            tables=[text.cell_table(cells, spec)], figures=[m_star_figure]),
        _refinement_section(facts.added),
        Section("Cross-check: the power-law fits", [
            "Per cell, err(m) = E_inf + A m^-beta; m* is the smallest m within the tolerance of "
            "the fitted asymptote. A fit whose m* lies outside the swept range, or whose "
            "asymptote is not a possible value of the metric, is reported as unidentified; the "
            "law m*(n) above uses the grid m* only."], tables=[text.fit_table(fitted)]),
        Section("Gains along m, in the paper's units", [
            f"Differences of {metric} in {spec.unit}" + (" (1 point = 0.01)" if spec.fraction
                                                         else "") + "."],
            tables=[text.gains_table(gains, spec, higher)]),
        Section("Inner error: 1/m against 1/sqrt(m)", [theory_text(theory, {
            r: [f.beta for f in fitted.fits if f.regime == r] for r in regimes})]),
        Section("Comparison with the paper", text.comparison_text(cells, laws, gains, spec)),
    ]
    numbers = {"metric": metric, "higher_is_better": higher, "tolerance": tolerance,
               "cells": [c.to_dict() for c in cells],
               "laws": {r: law.to_dict() for r, law in laws.items()},
               "recommendations": recs, "critical_m": fitted.to_dict(),
               "theory_inner_error": theory, "gains": gains, "test_size": facts.test_size,
               "baseline": facts.baseline, "baseline_label": facts.baseline_label,
               "refinement": facts.added,
               "cells_informative": sum(c.informative for c in cells)}
    return Analysis(text.headline(cells, laws, recs, spec, tolerance), sections, numbers)

