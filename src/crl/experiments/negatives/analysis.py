"""The analysis of ``crl study negatives``: the answer (:mod:`.answer`: m* from curves, the
tested law, the recommendation, the backtest, the theory's verdicts) at the user's tolerance
and at half and twice it, figures (:mod:`.figures`), words (:mod:`.text`) and tables
(:mod:`.tables`) put together into the report's sections and ``analysis.json``
(docs/negatives.md, "The report")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crl.experiments.metrics import MetricSpec
from crl.experiments.negatives import tables, text
from crl.experiments.negatives.answer import FACTORS, Answer, tolerance_sensitivity
from crl.experiments.negatives.control import ControlResult, control_text
from crl.experiments.negatives.curves import RESOLVED_STEP
from crl.experiments.negatives.fragment import (
    answer_section,
    closing_text,
    config_fragment,
    in_batch_fragment,
)
from crl.experiments.negatives.grid import Grid
from crl.experiments.negatives.setup import UNTRAINED
from crl.experiments.negatives.theory import theory_check, theory_text
from crl.experiments.negatives.tolerance import Tolerance
from crl.experiments.negatives.verify import VerifyResult, verify_text
from crl.experiments.study import Analysis, Section, Table
from crl.theory.scaling import fit_critical_m


@dataclass
class StudyFacts:
    """What the analysis needs to know beyond the result rows.

    Attributes:
        setup: The set-up section (sentences and tables, written by the study).
        grid: The sweep (its budget and batch: the training the answer holds for).
        target_n: The n to recommend m for (the user's whole training split by default).
        test_size: Pairs in the held-out test split every run is evaluated on.
        baseline: The metric of the model before training (the frozen or zero-shot baseline
            for a pretrained backbone), None when not measured.
        baseline_label: What that model is, in words.
        added: The runs the refinement added: ``{"stage", "regime", "n", "m", "seed",
            "reason"}``.
        control: The control arm's result per regime (:mod:`.control`; empty when not run).
        verify: The verify stage's measurement per regime (:mod:`.verify`).
        target_rows: The verify runs those measurements read (:func:`~.arms.target_rows`):
            the recommendation's cells at the target n, re-read at every tolerance.
        verify_note, control_note: Why the verify stage or the control arm has no result
            (when it has none), completing a sentence.
        run_config: A grid run's config: the loss, negatives and model the answer is
            written in (:mod:`.fragment`).
        embed_dim: The towers' output dimension ``D`` (None: not known), for the memory of
            the in-batch answer (:mod:`.memory`).
        pretrained: For a pretrained transformer, the model and what was frozen
            (:func:`crl.models.transformer.describe_pretrained`); None otherwise.
        grid_rule: Why the preset's grid is not the data set's (None when it is).
    """

    setup: Section
    grid: Grid
    target_n: int
    test_size: int | None = None
    baseline: float | None = None
    baseline_label: str = UNTRAINED
    added: list[dict[str, Any]] = field(default_factory=list)
    control: list[ControlResult] = field(default_factory=list)
    verify: list[VerifyResult] = field(default_factory=list)
    target_rows: list[dict[str, Any]] = field(default_factory=list)
    verify_note: str = "was not run (`--verify` runs it)."
    control_note: str = "was not run (`--control` runs it)."
    run_config: dict[str, Any] = field(default_factory=dict)
    embed_dim: int | None = None
    pretrained: dict[str, Any] | None = None
    grid_rule: str | None = None


def answer_fragments(result: Answer, facts: StudyFacts
                     ) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """Each regime's recommendation as config sections, and the shared one's in-batch batch
    size with its memory (:mod:`.fragment`): where the verify stage measured the answer at the
    target n, that measurement (:func:`~.laws.measured_at_target`)."""
    config = facts.run_config
    loss = config.get("loss") or {"name": "gcl", "temperature": None}
    exclude = bool((config.get("negatives") or {}).get("exclude_same_label"))
    recommendations = result.recommendations
    fragments = {r: f for r, rec in recommendations.items()
                 if (f := config_fragment(rec, loss, exclude)) is not None}
    shared = recommendations.get("shared")
    in_batch = None if shared is None else in_batch_fragment(
        shared, loss, facts.embed_dim, config.get("model") or {})
    return fragments, in_batch


def budget_numbers(grid: Grid, target_n: int) -> dict[str, Any]:
    """The training the answer holds for (``analysis.json``'s ``budget``, restated beside
    every recommendation): samples per run or epochs at every n, and what it is at the
    target n."""
    return {"mode": "epochs" if grid.target_epochs is not None else "samples",
            "training": grid.training_text(), "target_epochs": grid.target_epochs,
            "samples_per_run": None if grid.target_epochs is not None else grid.budget,
            "batch_size": grid.batch_size, "target_n": target_n,
            "epochs_at_target": grid.epochs(target_n),
            "samples_at_target": grid.samples(target_n),
            "epochs": {str(n): grid.epochs(n) for n in grid.ns},
            "samples": {str(n): grid.samples(n) for n in grid.ns}}


#: How m is written everywhere in the report, stated once (where the answer begins).
CONVENTION = ("The convention of this whole report: m and m* count negatives per anchor, and "
              "\"% of n\" divides that count by the n it belongs to, a cell's own n or, for a "
              "recommendation, the target n (a nearest cell's m* is carried to the target as a "
              "count, not as a fraction).")


def budget_text_short(grid: Grid, target_n: int) -> str:
    """The training in a few words: ``12,000 samples per run at batch 128``."""
    return f"{grid.training_text()} at batch {grid.batch(target_n)}"


def _control_section(control: list[ControlResult], note: str) -> Section:
    if not control:
        return Section("Control arm: m or the negatives per step", [
            "The control arm (the same m at a second batch size, separating m from "
            "k = B m / n) " + note])
    return Section("Control arm: m or the negatives per step", [
        "GCL at batch B meets k = B m / n of an anchor's negatives per step, so along one batch "
        "size m and k move together. The control arm trains the same n and m at a batch r "
        "times smaller (k r times smaller), paired by seed. If the curve follows m, the "
        "control's curve is the main one up to a level shift c (b = 0); if it follows k, it is "
        "the main curve at m / r (b = 1).", *[control_text(c) for c in control]])


def _verify_section(verify: list[VerifyResult], note: str, metric: str,
                    higher: bool) -> Section:
    if not verify:
        return Section("Verify: the recommendation at your n", [
            "The verify stage (runs at the target n at m_rec / 2, m_rec, 2 m_rec and the "
            "largest m) " + note])
    return Section("Verify: the recommendation at your n", [
        "The recommendation is trained where it is used: at the target n, at m_rec / 2, m_rec, "
        "2 m_rec and the largest m, with the study's training. The best of these m is picked "
        "on the same runs, so the difference leans towards it.",
        *[verify_text(v, metric, higher) for v in verify]])


def distinct_added(added: list[dict[str, Any]]) -> int:
    """Distinct runs among the refinement's additions (with m >= n - 1 one run serves both
    regimes)."""
    return len({(a["regime"] if a["m"] < a["n"] - 1 else "shared", a["n"], a["m"], a["seed"])
                for a in added})


def _refinement_section(added: list[dict[str, Any]], budget: int) -> Section:
    if not added and budget == 0:
        return Section("Refinement", [
            "The refinement stage was off: its run budget is 0 (the preset's, or --refine-runs "
            "0); --refine-runs N adds up to N runs where the m* intervals are widest."])
    if not added:
        return Section("Refinement", [
            f"The refinement stage added no runs within its budget of {budget:,}: no cell's "
            "interval held a new whole m, or each cell's runs (new m in its interval, times "
            "every seed) exceeded the budget left."])
    groups: dict[tuple[Any, ...], list[int]] = {}
    for a in added:
        groups.setdefault((a["stage"], a["regime"], a["n"], a["m"], a["reason"]), []) \
            .append(int(a["seed"]))
    rows = [[stage, regime, n, m, text.pct(m, n), ", ".join(map(str, sorted(seeds))), reason]
            for (stage, regime, n, m, reason), seeds in sorted(groups.items())]
    runs = distinct_added(added)
    return Section("Refinement", [
        "Each stage added runs to the cells whose m* interval was widest in log m, whatever "
        "the cause (censored, seed noise or the grid step), at m spaced evenly in log m inside "
        "it, with the same seeds for both regimes, except located cells whose swept m around "
        f"m* were already at most {RESOLVED_STEP:g}x apart: there the interval is the seeds' "
        "spread, which more m cannot narrow (more seeds could); "
        f"{runs} distinct runs were added."],
        tables=[Table("Runs added by the refinement", ["stage", "regime", "n", "m",
                                                       "m (% of n)", "seeds", "why"], rows)])


def _negatives_per_step(rows: list[dict[str, Any]], grid: Grid) -> tuple[float, float]:
    """The smallest and largest ``k = B m / n`` over the runs (B the batch, at most n)."""
    ks = [grid.negatives_per_step(int(r["n"]), float(r["m"])) for r in rows]
    return (min(ks), max(ks)) if ks else (math.nan, math.nan)


def _sensitivity(answers: list[Answer]) -> list[dict[str, Any]]:
    return [{"tolerance": str(a.tolerance), "tolerance_value": a.tolerance.value,
             "cells": [{"regime": c.regime, "n": c.n, "status": c.status, "m_star": c.m_star,
                        "interval": c.to_dict()["interval"]} for c in a.cells],
             "laws": {r: {"alpha": law.alpha, "alpha_ci": law.to_dict()["alpha_ci"],
                          "verdict": law.verdict} for r, law in a.laws.items()},
             "recommendations": {r: x.to_dict() for r, x in a.recommendations.items()}}
            for a in answers]


def build_analysis(rows: list[dict[str, Any]], study_dir: Path, *, spec: MetricSpec,
                   tolerance: Tolerance, preset: str, facts: StudyFacts) -> Analysis:
    """The report sections and key numbers of a negatives study from its result rows (which
    must hold ``spec.name``); figures go to ``study_dir/plots``."""
    # matplotlib on first use: a study's workers import this module (its tasks hold the
    # study) and never draw
    from crl.experiments.negatives.figures import plot_curves, plot_m_star, plot_regimes

    metric, higher, grid = spec.name, spec.higher_is_better, facts.grid
    answers = tolerance_sensitivity(rows, metric, higher, tolerance, facts.target_n,
                                    target_rows=facts.target_rows)
    result = answers[FACTORS.index(1.0)]
    cells = list(result.cells)
    budget = text.Budget(grid.samples(facts.target_n), grid.batch_size, facts.target_n,
                         grid.epochs(facts.target_n), grid.training_text(),
                         grid.target_epochs)
    verified = {v.plan.regime: verify_text(v, metric, higher) for v in facts.verify}
    # The cross-check takes one delta in metric units: a relative one's median over cells.
    delta = float(np.median([c.tolerance_points for c in cells])) if cells else tolerance.value
    fitted = fit_critical_m(rows, delta, metric=metric, higher_is_better=higher,
                            num_bootstrap=300, seed=0, error_bounds=spec.error_bounds())
    theory = theory_check(study_dir, preset)
    gains = tables.gains(cells)
    curves = plot_curves(rows, cells, metric, higher, facts.baseline, study_dir,
                         baseline_label=facts.baseline_label)
    m_star_figure = plot_m_star(cells, result.laws, study_dir)
    regime_figure = plot_regimes(rows, metric, study_dir)
    evaluation = (f"Every run is evaluated on the same {facts.test_size:,} held-out test pairs."
                  if facts.test_size else "Every run is evaluated on the same held-out pairs.")
    baseline = ("" if facts.baseline is None else
                f" The dashed line is the baseline, {facts.baseline_label} ({metric} = "
                f"{facts.baseline:.3f}).")
    epochs = tuple(grid.epochs(n) for n in (max(grid.ns), min(grid.ns)))
    k_range = _negatives_per_step(rows, grid)
    verdicts = [v.sentence for v in result.verdicts.values()]
    contradicted = any(v.verdict == "contradicted" for v in result.verdicts.values())
    regimes = list(result.laws)
    fragments, in_batch = answer_fragments(result, facts)
    sections = [
        facts.setup,
        Section("The answer for your n", [CONVENTION] + [text.recommendation_text(r, budget)
                                          + (" " + verified[r.regime] if r.regime in verified
                                             else "")
                                          for r in result.recommendations.values()],
                tables=[tables.recommendation_table(result)]),
        answer_section(fragments, in_batch, budget_text_short(grid, facts.target_n)),
        _verify_section(facts.verify, facts.verify_note, metric, higher),
        Section("The theory's prediction per regime", [text.prediction_text(), *verdicts]
                + ([text.confounds_text((epochs[0], epochs[1]), k_range,
                                        [c.verdict for c in facts.control])]
                   if contradicted else [])),
        _control_section(facts.control, facts.control_note),
        Section("Metric against the number of negatives", [
            f"Each point is the mean over seeds of {spec.description} ({metric}) against m in % "
            f"of n; error bars are the standard deviation over seeds. {evaluation}{baseline}"],
            figures=[curves, regime_figure]),
        Section("Where the gains stop: m* per (regime, n)", [
            f"For each regime and n the metric is fitted against log m, on the means per m "
            "adjusted for each seed's level (runs with one seed share the initialisation and "
            "the data order), by a saturating curve when its lack-of-fit test passes and by an "
            "isotonic (monotone) fit otherwise. m* is where the fitted curve first comes within "
            f"the tolerance ({tolerance}) of its value at the largest swept m, read between "
            "swept m. Its 95% interval resamples whole seeds (every distinct resample when "
            "there are at most 2,000); the grid's resolution around m* is a limit of its own, "
            "stated beside it. A cell is censored when the curve only bounds m*: still rising "
            "in its last step (not saturated), or already within the tolerance at the "
            "smallest swept m.", *[f"{c.regime} n = {c.n:,}: {text.cell_text(c)}."
                                    for c in cells]],
            tables=[tables.cell_table(cells, spec, grid.batch_size)], figures=[m_star_figure]),
        Section("The law m*(n), tested before it is used", [
            text.law_text(result.laws[r], result.laws_located[r]) for r in regimes]
            + [f"Backtest ({r}): {b.reason}." for r, b in result.backtests.items()],
            tables=[tables.law_table(result), tables.residual_table(result)]),
        Section("Sensitivity to the tolerance", [
            f"The same analysis at half ({answers[0].tolerance}) and twice "
            f"({answers[-1].tolerance}) the chosen tolerance."],
            tables=[tables.sensitivity_table(answers)]),
        _refinement_section(facts.added, grid.refine_runs),
        Section("Cross-check: the power-law fits", [
            "Per cell, err(m) = E_inf + A m^-beta; m* is the smallest m within the tolerance of "
            "the fitted asymptote. A fit whose m* lies outside the swept range, or whose "
            "asymptote is not a possible value of the metric, is reported as unidentified; the "
            "answer above uses the curves of the m* section only."],
            tables=[tables.fit_table(fitted)]),
        Section("Gains along m, in the paper's units", [
            f"Differences of {metric} in {spec.unit}" + (" (1 point = 0.01)" if spec.fraction
                                                         else "") + "."],
            tables=[tables.gains_table(gains, spec, higher)]),
        Section("Inner error: 1/m against 1/sqrt(m)", [theory_text(theory, {
            r: [f.beta for f in fitted.fits if f.regime == r] for r in regimes})]),
        Section("Comparison with the paper", text.comparison_text(cells, gains, spec)),
    ]
    numbers = {"metric": metric, "higher_is_better": higher, **result.to_dict(),
               "budget": budget_numbers(grid, facts.target_n),
               "control": [c.to_dict() for c in facts.control],
               "verify": [v.to_dict(higher) for v in facts.verify],
               "negatives_per_step": {"range": list(k_range),
                                      "at_m_star": {f"{c.regime} {c.n}":
                                                    grid.negatives_per_step(c.n, c.m_star)
                                                    for c in cells if c.m_star is not None}},
               "fragments": fragments, "in_batch": in_batch,
               "sensitivity": _sensitivity(answers), "critical_m": fitted.to_dict(),
               "theory_inner_error": theory, "gains": gains, "test_size": facts.test_size,
               "baseline": facts.baseline, "baseline_label": facts.baseline_label,
               "refinement": facts.added, "refinement_runs": distinct_added(facts.added),
               "refinement_budget": grid.refine_runs,
               "refinement_resolved_step": RESOLVED_STEP,
               "pretrained": facts.pretrained, "grid_rule": facts.grid_rule}
    for regime, rec in numbers["recommendations"].items():  # each restates its training
        rec["budget"] = numbers["budget"]
        found = [v for v in numbers["verify"] if v["regime"] == regime]
        rec["verify"] = found[0] if found else None
    return Analysis(text.headline(result, spec, budget, facts.verify), sections, numbers,
                    closing=closing_text(fragments, in_batch,
                                         budget_text_short(grid, facts.target_n)))
