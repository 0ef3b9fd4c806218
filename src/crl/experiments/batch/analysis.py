"""The whole answer of a batch study from its result rows: B* with its interval, the metric and
the cost per B, the sensitivity to the tolerance and the link to the negatives study's m
(docs/batch.md, "The report"; docs/theory.md §5 and §9).

Pure functions of the rows except :func:`build_analysis`, which also draws the figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from crl.experiments.batch.curve import b_star
from crl.experiments.batch.figures import batch_figure
from crl.experiments.batch.grid import BatchGrid
from crl.experiments.metrics import MetricSpec
from crl.experiments.negatives.answer import FACTORS
from crl.experiments.negatives.curves import CurveCell
from crl.experiments.negatives.text import m_text, pct
from crl.experiments.negatives.tolerance import Tolerance
from crl.experiments.study import Analysis, Section, Table


@dataclass(frozen=True)
class BatchFacts:
    """What the analysis states beside the rows: the set-up section, the grid, the training
    pairs ``n`` (the largest possible batch), the metric, the tolerance, the refinement's runs."""

    setup: Section
    grid: BatchGrid
    n: int
    spec: MetricSpec
    tolerance: Tolerance
    added: list[dict[str, Any]] = field(default_factory=list)


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def _number(row: dict[str, Any], key: str) -> float:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def per_batch(rows: list[dict[str, Any]], cell: CurveCell, grid: BatchGrid,
              spec: MetricSpec) -> list[dict[str, Any]]:
    """Per swept B: its m, steps, micro-batch, seed-adjusted mean of the metric (in its own
    direction), the seeds' SD, and the cost measured in its runs (means over seeds)."""
    sign = 1.0 if spec.higher_is_better else -1.0
    out = []
    for b, mean in zip(cell.ms, cell.means, strict=True):
        runs = [r for r in rows if int(r["batch_size"]) == int(b)]
        values = [_number(r, spec.name) for r in runs]
        finite = [v for v in values if math.isfinite(v)]
        out.append({
            "batch_size": int(b), "m": int(b) - 1, "steps": grid.steps(int(b)),
            "epochs": grid.steps(int(b)) / max(1, cell.n // int(b)),
            "micro_batch_size": grid.micro_batch(int(b)), "runs": len(finite),
            "mean": sign * mean,
            "sd": float(np.std(finite, ddof=1)) if len(finite) > 1 else math.nan,
            "peak_rss_growth_mib": _mean([_number(r, "cost/peak_rss_growth_mib") for r in runs]),
            "peak_cuda_mib": _mean([_number(r, "cost/peak_cuda_mib") for r in runs]),
            "step_s": _mean([_number(r, "cost/step_s") for r in runs]),
            "loop_s": _mean([_number(r, "cost/loop_s") for r in runs])})
    return out


def interval_text(lower: float, upper: float) -> str:
    """A B* interval, an open lower end as a dash.

    Example:
        >>> interval_text(0.0, 64.0), interval_text(128.0, math.inf)
        ('[—, 64]', '[128, ∞]')
    """
    return f"[{'—' if lower <= 0 else m_text(lower)}, {m_text(upper)}]"


class HasReading(Protocol):
    """A reading of B*: a :class:`~crl.experiments.negatives.curves.CurveCell` or a seed's
    :class:`~crl.experiments.negatives.curves.Reading`."""

    @property
    def status(self) -> str: ...
    @property
    def m_star(self) -> float | None: ...
    @property
    def lower(self) -> float: ...
    @property
    def upper(self) -> float: ...


def b_text(c: HasReading) -> str:
    """B* in words: the point with its interval, or the censored bound.

    Example:
        >>> from crl.experiments.negatives.curves import Reading
        >>> b_text(Reading("above", None, 512.0, math.inf))
        'B* not located (above the swept B; 95% interval [512, ∞])'
        >>> b_text(Reading("below", None, 0.0, 8.0))
        'B* not located (at or below the smallest swept B; 95% interval [—, 8])'
        >>> b_text(Reading("located", 256.0, 256.0, 256.0))
        'B* = 256 [256, 256]'
    """
    interval = interval_text(c.lower, c.upper)
    if c.m_star is not None:
        return f"B* = {m_text(c.m_star)} {interval}"
    where = "above the swept B" if c.status == "above" else "at or below the smallest swept B"
    return f"B* not located ({where}; 95% interval {interval})"


def sensitivity(rows: list[dict[str, Any]], spec: MetricSpec, tolerance: Tolerance, n: int
                ) -> list[tuple[Tolerance, CurveCell]]:
    """B* at half, the chosen and twice the tolerance."""
    out = []
    for f in FACTORS:
        cell = b_star(rows, spec.name, spec.higher_is_better, tolerance.scaled(f), n)
        if cell is not None:
            out.append((tolerance.scaled(f), cell))
    return out


def _tables(cell: CurveCell, batches: list[dict[str, Any]], spec: MetricSpec,
            sens: list[tuple[Tolerance, CurveCell]]) -> list[Table]:
    answer = Table(
        "B*: the smallest B whose fitted curve comes within the tolerance of the best",
        ["B*", "95% interval (seed resamples)", "m = B* - 1 (shared, in batch)",
         "m (% of the training pairs)", "grid step around B* (factor)", "curve", "seeds",
         "resamples", "reading"],
        [[m_text(cell.m_star), interval_text(cell.lower, cell.upper),
          "—" if cell.m_star is None else m_text(cell.m_star - 1),
          "—" if cell.m_star is None else pct(cell.m_star - 1, cell.n), cell.resolution,
          f"{cell.method} ({cell.method_reason})", len(cell.seeds),
          f"{cell.num_resamples} ({'exact' if cell.exact else 'random'})",
          cell.status if not cell.reason else f"{cell.status}: {cell.reason}"]])
    per_b = Table(
        f"{spec.name} and the cost per B (means over seeds; memory and time measured in the runs "
        "here)",
        ["B", "m = B - 1", "steps", "epochs", "micro-batch (gradient caching)", "runs",
         f"{spec.name} (seed-adjusted)", "SD across seeds", "peak RSS growth (MiB)",
         "peak CUDA memory (MiB)", "time per step (s)", "training loop (s)"],
        [[b["batch_size"], b["m"], b["steps"], b["epochs"],
          "one pass" if b["micro_batch_size"] is None else b["micro_batch_size"], b["runs"],
          b["mean"], b["sd"], b["peak_rss_growth_mib"], b["peak_cuda_mib"], b["step_s"],
          b["loop_s"]] for b in batches])
    seeds = Table("Each seed's own reading (the same curve method)", ["seed", "reading"],
                  [[s.seed, b_text(s.reading)] for s in cell.per_seed])
    sens_table = Table("Sensitivity to the tolerance: half, the chosen and twice",
                       ["tolerance", "tolerance (points of the metric)", "B*", "status"],
                       [[str(t), c.tolerance_points, b_text(c), c.status] for t, c in sens])
    return [answer, per_b, seeds, sens_table]


def link_paragraphs(cell: CurveCell, spec: MetricSpec, grid: BatchGrid) -> list[str]:
    """The link to the negatives study's m, and what the fixed budget confounds."""
    m = ("m = B* - 1 = " + m_text(cell.m_star - 1) + f" ({pct(cell.m_star - 1, cell.n)} of the "
         f"{cell.n:,} training pairs)" if cell.m_star is not None
         else "m = B* - 1, bounded as B* is")
    return [
        f"A batch of B gives each anchor m = B - 1 in-batch negatives, the other pairs of its "
        f"batch, and every anchor of the batch shares them: the CLIP/MNRL setting, the shared "
        f"regime of docs/theory.md §9 (SSCRL), drawn afresh each step. Here that is {m}. The "
        "negatives study (crl study negatives) fixes B and moves m with GCL, whose running "
        "estimate reaches beyond the batch; its shared-regime m* at this n is the number to "
        "compare with, and the theory's shared-set inner error falls like 1/sqrt(m) "
        "(docs/theory.md §5).",
        f"What the two studies do not share: under a fixed budget of {grid.budget:,} training "
        "pairs per run, a larger B also means fewer optimiser steps (steps = budget / B, see the "
        "table), at the config's own learning rate and schedule, so B* here weighs the "
        "negatives a batch holds against the steps it costs. Past the best B the metric falls "
        "when the lost steps cost more than the negatives gain; a larger budget, or a learning "
        "rate scaled with B, moves B*.",
    ]


def headline(cell: CurveCell, batches: list[dict[str, Any]], spec: MetricSpec,
             facts: BatchFacts) -> str:
    """The answer in one sentence: B* (or its bound) with the tolerance, the budget and the
    cost at B*."""
    best = max(batches, key=lambda b: b["mean"] if spec.higher_is_better else -b["mean"])
    budget = (f"at {facts.grid.budget:,} training pairs per run ({facts.n:,} pairs, "
              f"{len(cell.seeds)} seeds)")
    tol = f"within {facts.tolerance} of the best {spec.name}"
    if cell.m_star is None:
        return (f"{b_text(cell)} {budget}: {cell.reason}. The best swept B is "
                f"{best['batch_size']:,} ({spec.name} {best['mean']:.3g}).")
    at = min(batches, key=lambda b: abs(math.log(b["batch_size"] / cell.m_star)))
    cost = ""
    if math.isfinite(at["step_s"]):
        cost = (f"; at B = {at['batch_size']:,} a step took {at['step_s']:.3g} s and the loop "
                f"grew the resident memory by {at['peak_rss_growth_mib']:.3g} MiB here")
    return (f"{b_text(cell)} {budget}: the smallest batch {tol} ({best['mean']:.3g} at B = "
            f"{best['batch_size']:,}), i.e. m = {m_text(cell.m_star - 1)} shared in-batch "
            f"negatives per anchor{cost}.")


def build_analysis(rows: list[dict[str, Any]], study_dir: Path, facts: BatchFacts
                   ) -> Analysis:
    """The :class:`~crl.experiments.study.Analysis` of a batch study's ``rows``."""
    spec = facts.spec
    cell = b_star(rows, spec.name, spec.higher_is_better, facts.tolerance, facts.n)
    if cell is None:
        return Analysis("Batch study: fewer than 2 batch sizes finished; no B* to read.",
                        [facts.setup], {"cell": None})
    batches = per_batch(rows, cell, facts.grid, spec)
    sens = sensitivity(rows, spec, facts.tolerance, facts.n)
    figure = batch_figure(rows, cell, batches, spec, study_dir)
    result = Section("B* and what each B cost", [
        f"B* is read on the curve of {spec.name} against log B, fitted over the swept B up to "
        f"the best ({cell.method} curve: {cell.method_reason}); its interval resamples whole "
        f"seeds ({cell.num_resamples} {'exact' if cell.exact else 'random'} resamples, the "
        "best B re-chosen in each) and measures seed noise only; the grid's own resolution is "
        "the step factor beside it.",
        "Memory is the training loop's peak resident-set growth above the process's size when "
        "the loop started (after the data and model were built); time is the loop's wall "
        "clock over its steps, the final evaluation excluded. Both were measured on this "
        "machine, in the runs of the table, alongside whatever else ran here.",
    ], tables=_tables(cell, batches, spec, sens), figures=[figure])
    link = Section("The link to the negatives study's m", link_paragraphs(cell, spec,
                                                                           facts.grid))
    refine = Section("Refinement", [
        f"{len(facts.added)} runs were added where the B* interval was widest in log B "
        "(crl.experiments.negatives.refine, every seed at each new B)."
        if facts.added else "No refinement runs were added."])
    numbers = {"cell": cell.to_dict(), "b_star": cell.m_star,
               "interval": [cell.lower, cell.upper if math.isfinite(cell.upper) else None],
               "m_star": None if cell.m_star is None else cell.m_star - 1,
               "status": cell.status, "n": facts.n, "budget": facts.grid.budget,
               "tolerance": {"value": facts.tolerance.value,
                             "relative": facts.tolerance.relative,
                             "text": str(facts.tolerance)},
               "per_batch": batches,
               "sensitivity": [{"tolerance": str(t), "b_star": c.m_star, "status": c.status,
                                "interval": [c.lower, c.upper if math.isfinite(c.upper)
                                             else None]} for t, c in sens],
               "added": facts.added}
    return Analysis(headline(cell, batches, spec, facts), [facts.setup, result, link, refine],
                    numbers)
