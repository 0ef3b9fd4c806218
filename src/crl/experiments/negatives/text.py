"""The sentences of the negatives report: m* per cell, the law, the recommendation in the
user's units with its budget, the theory's prediction per regime and its verdicts, and the
headline (docs/negatives.md, "The report"; docs/theory.md §7, "The per-regime prediction").

Every number in these sentences is formatted from a value that ``analysis.json`` carries
(tests/experiments/test_negatives_report_numbers.py walks them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from crl.experiments.metrics import MetricSpec
from crl.experiments.negatives.answer import Answer
from crl.experiments.negatives.curves import CurveCell
from crl.experiments.negatives.laws import LawFit, Recommendation
from crl.experiments.negatives.paper import PAPER
from crl.experiments.negatives.stats import REGIMES
from crl.experiments.negatives.verdict import PREDICTED_ALPHA, interval_text
from crl.experiments.negatives.verify import VerifyResult


@dataclass(frozen=True)
class Budget:
    """The training every run had, and what it means at the target n.

    Attributes:
        samples: Processed samples per run at the target n (every run's, unless the study
            trains a number of epochs). batch_size: The batch (at most n).
        target_n: The n the recommendation is for. epochs_at_target: Passes over the target
            n's anchors at that budget, counted as the runs count epochs (steps over full
            batches per pass, ``floor(n / B)``).
        training: The training of a run in words (:meth:`.grid.Grid.training_text`).
        target_epochs: The epochs every n trains (``--target-epochs``), None when every run
            trains ``samples``.
    """

    samples: int
    batch_size: int
    target_n: int
    epochs_at_target: float
    training: str = ""
    target_epochs: float | None = None

    @property
    def words(self) -> str:
        """The training in words: ``training``, or the samples per run."""
        return self.training or f"{self.samples:,} samples per run"


def pct(m: float, n: float) -> str:
    """``m`` in % of ``n`` (a dash when not finite).

    Example:
        >>> pct(25, 1000), pct(math.inf, 10)
        ('2.5%', '—')
    """
    return f"{100 * m / n:.3g}%" if math.isfinite(m) else "—"


def m_text(value: float | None) -> str:
    """An m as a whole number with separators (``∞`` when open, ``—`` when missing)."""
    if value is None:
        return "—"
    return "∞" if math.isinf(value) else f"{value:,.0f}"


def cell_text(c: CurveCell) -> str:
    """What a cell says about m*, in words: the reading, the seeds' interval, the curve and
    the grid's own resolution."""
    curve = f"{c.method} curve ({c.method_reason})"
    grid = f"the grid steps by a factor {c.resolution:.3g} around it"
    resamples = f"{c.num_resamples} {'exact' if c.exact else 'random'} seed resamples"
    if c.m_star is None:
        return f"{c.reason}; {curve}; {grid}"
    return (f"m* = {m_text(c.m_star)} ({pct(c.m_star, c.n)} of n), 95% interval over "
            f"{resamples} [{m_text(c.lower)}, {m_text(c.upper)}]; {curve}; {grid}")


def law_text(law: LawFit, without: LawFit) -> str:
    """One regime's law with and without its censored cells, and whether it fits."""
    lead = f"{law.regime.capitalize()} sets: "
    if law.alpha is None:
        return lead + f"no law ({law.reason})."
    text = (lead + f"alpha = {interval_text(law.alpha, law.alpha_ci)} over "
            f"{len(law.observations)} cells; {law.reason}.")
    censored = len(law.observations) - len(without.observations)
    if censored:
        text += (f" Without its {censored} censored cell(s): alpha = "
                 f"{interval_text(without.alpha, without.alpha_ci)} ({without.verdict}).")
    return text


def budget_text(budget: Budget) -> str:
    """The training the answer holds for, restated."""
    if budget.target_epochs is not None:
        return (f"It holds for the training it was measured at: {budget.training} at batch "
                f"{budget.batch_size}, which at n = "
                f"{budget.target_n:,} is {budget.samples:,} samples.")
    return (f"It holds for the training it was measured at: {budget.samples:,} samples per "
            f"run at batch {budget.batch_size}, which at n = {budget.target_n:,} is "
            f"{budget.epochs_at_target:.3g} epochs.")


def units_text(rec: Recommendation, m: float) -> str:
    """The recommendation in the user's units."""
    if rec.regime == "shared":
        return (f"In practice: with in-batch negatives (CLIP, MNRL), a batch of about "
                f"{round(m) + 1:,} (with train.micro_batch_size, micro-batches that fit your "
                f"memory); with GCL at batch B, a shared negative set of m = {m_text(m)} "
                "(negatives.regime shared, negatives.m).")
    return (f"In practice: with GCL at batch B, an independent set of m = {m_text(m)} "
            "negatives per anchor (negatives.regime independent, negatives.m).")


def recommendation_text(rec: Recommendation, budget: Budget) -> str:
    """The answer for the user's n: the value, where it comes from, its units and budget."""
    lead = f"With {rec.regime} negatives at n = {rec.target_n:,}"
    if rec.source == "law" and rec.m is not None:
        text = (f"{lead}, use m of about {m_text(rec.m)} per anchor ({pct(rec.m, rec.target_n)} "
                f"of n; 95% interval [{m_text(rec.low)}, {m_text(rec.high)}]), the prediction "
                "of the law m*(n), which fits its cells.")
        if rec.extrapolation:
            text += " This is an extrapolation: n lies outside the swept range."
        if "capped" in rec.reason:
            text += " The law asks for more than all other anchors, so use them all."
    elif rec.source == "verify stage":
        text = (f"{lead}, use m of about {m_text(rec.m)} per anchor ({pct(rec.m, rec.target_n)} "
                f"of n; 95% interval [{m_text(rec.low)}, {m_text(rec.high)}] over seed "
                "resamples), measured at this n by the verify stage and read from its fitted "
                "curve like every cell." if rec.m is not None else
                f"{lead}: the verify stage's runs at this n only bound m* to "
                f"[{m_text(rec.low)}, {m_text(rec.high)}].")
        text += " " + prediction_words(rec)
    elif rec.source == "nearest cell":
        why = ("one power law does not describe these cells" if "does not fit" in rec.reason
               else "the law is untested")
        text = (f"{lead}: {why}, so no m is extrapolated; the measured cell nearest the target, "
                f"n = {rec.n_used:,}, ")
        text += (f"has m* = {m_text(rec.m)} (95% interval [{m_text(rec.low)}, "
                 f"{m_text(rec.high)}])." if rec.m is not None else
                 f"only bounds m* to [{m_text(rec.low)}, {m_text(rec.high)}].")
    else:
        return f"{lead}: no recommendation ({rec.reason})."
    value = rec.m if rec.m is not None else rec.low if rec.low > 0 else None
    if value is not None and math.isfinite(value):
        text += " " + units_text(rec, value)
    return text + " " + budget_text(budget)


def prediction_words(rec: Recommendation) -> str:
    """How the grid's prediction at the target n compares with the measurement there."""
    p = rec.prediction
    if p is None:
        return ""
    inside = rec.prediction_inside
    where = ("the law m*(n)" + (", extrapolated" if p.extrapolation else "") if p.source == "law"
             else f"the measured cell nearest the target, n = {p.n_used:,}"
             if p.source == "nearest cell" else p.source)
    value = (f"m = {m_text(p.m)} [{m_text(p.low)}, {m_text(p.high)}]" if p.m is not None else
             f"only bounds [{m_text(p.low)}, {m_text(p.high)}]")
    verdict = ("cannot be compared" if inside is None else
               "the measurement lies inside its interval" if inside else
               "the measurement lies outside its interval: the grid's prediction missed at this n")
    return f"Before the measurement the grid predicted {value} ({where}); {verdict}."


def prediction_text() -> str:
    """The theory's prediction per regime, with its derivation."""
    return ("The theory's prediction (docs/theory.md §7, \"The per-regime prediction\"): the "
            "excess error is about the inner error a m^-k plus the outer error b n^-1/2, with "
            "k = 1 for independent sets (SCRL) and k = 1/2 for a shared set (SSCRL). More "
            "negatives stop paying when the inner term has fallen to the outer one, at m*(n) = "
            "(a / b)^(1/k) n^(1/(2k)): alpha = 1/2 with independent sets, alpha = 1 with a "
            "shared set, and the shared exponent larger by 1/2. Each measured alpha is judged "
            "against its own regime's prediction: consistent (its 95% interval holds it), "
            "contradicted (the interval excludes it) or cannot tell (the law does not fit, "
            "or the interval is unbounded, wider than 1, or holds both predictions).")


def confounds_text(epochs: tuple[float, float], k: tuple[float, float],
                   control: list[str] | None = None) -> str:
    """What else changes with n in this study, beside a contradiction (``control``: the
    control arm's verdicts, when it ran)."""
    found = sorted(set(control or []))
    arm = ("A control arm that trains one m at two batch sizes (separating m from k) has not "
           "been run." if not found else
           "The control arm, which trains the same m at a second batch size, finds: "
           + ", ".join(f"follows {v}" if v in ("m", "k") else v for v in found)
           + " (its section).")
    return ("Where the data contradict the theory, these also change with n here and may be "
            f"the cause: the tolerance is one fixed amount for every n (the theory's balance "
            f"moves it with n^-1/2); under the fixed budget the runs see {epochs[0]:.3g} to "
            f"{epochs[1]:.3g} epochs; the metric (recall@1) is not the risk; and with GCL an "
            f"anchor meets k = B m / n of its negatives per step ({k[0]:.3g} to {k[1]:.3g} "
            "over the runs), so m and k move together. " + arm)


def _headline_regime(result: Answer, regime: str) -> str:
    law = result.laws[regime]
    rec = result.recommendations[regime]
    verdict = result.verdicts[regime]
    predicted = f"{PREDICTED_ALPHA[regime]:g}"
    if law.verdict == "does not fit":
        shape = "one power law does not describe these cells"
    elif law.alpha is None:
        shape = f"m*(n) not identified ({law.reason})"
    else:
        shape = f"m* ~ n^{interval_text(law.alpha, law.alpha_ci)} ({law.verdict})"
    answer_part = (f"use m ≈ {m_text(rec.m)} ({pct(rec.m, rec.target_n)} of n) at n = "
                   f"{rec.target_n:,} (" + _source_words(rec) + ")"
                   if rec.m is not None else
                   f"only bounds at n = {rec.target_n:,}: m* in [{m_text(rec.low)}, "
                   f"{m_text(rec.high)}] (" + _source_words(rec) + ")" if rec.low > 0 else
                   "no point recommendation")
    return (f"{regime}: {shape}, against the theory's {predicted}: {verdict.verdict}; "
            f"{answer_part}")


def _source_words(rec: Recommendation) -> str:
    if rec.source == "law":
        return "the law"
    if rec.source == "verify stage":
        return "measured there by the verify stage"
    return f"the nearest measured cell, n = {rec.n_used:,}"


def _verified_words(v: VerifyResult) -> str:
    """The verify stage in the headline: the prediction's verdict and the measured answer's
    check, each against the best measured at the target n."""
    text = (f" Verified at n = {v.plan.target_n:,} ({v.plan.regime}): the prediction m = "
            f"{v.plan.m_rec:,} is {v.verdict} the tolerance of the best measured there (m = "
            f"{v.best_m:,})")
    cell, check = v.cell, v.check
    if cell is None or check is None:
        return text + "."
    if cell.m_star is None:
        bound = (f"m* >= {m_text(cell.lower)}" if cell.status == "above" else
                 f"m* <= {m_text(cell.upper)}")
        return text + f"; the runs there bound the answer only: {bound}."
    return text + (f"; measured there, m* = {m_text(cell.m_star)}, and m = {check.m:,}, the "
                   f"first measured m at or above it, is {check.verdict} it.")


def headline(result: Answer, spec: MetricSpec, budget: Budget,
             verify: Sequence[VerifyResult] = ()) -> str:
    """The tolerance, each regime's law against its prediction, the answer for the n and, when
    the verify stage ran, whether it holds there."""
    if not result.cells:
        return "No finished runs to analyse."
    verified = "".join(_verified_words(v) for v in verify)
    if all(c.status == "below" for c in result.cells):
        return ("On this data and budget the number of negatives made no measurable "
                f"difference: in every (regime, n) the curve at the smallest swept m is within "
                f"the tolerance {result.tolerance} of its top ({spec.name}), trained for "
                f"{budget.words}, so m* <= the smallest swept m everywhere. If the metric is "
                "near chance, train longer or choose a metric the model can move." + verified)
    parts = [_headline_regime(result, r) for r in REGIMES if r in result.laws]
    text = (f"How many negatives this data can use, within {result.tolerance} of the best "
            f"{spec.name} (the tolerance; the report shows half and twice it), trained for "
            f"{budget.words}: " + "; ".join(parts) + ".")
    difference = result.verdicts.get("shared - independent")
    if difference is not None:
        text += (f" The difference alpha_shared - alpha_independent: "
                 f"{interval_text(difference.estimate, difference.interval)} against the "
                 f"predicted +{difference.predicted:g}: {difference.verdict}.")
    return text + verified


def comparison_text(cells: list[CurveCell], gains: list[dict[str, float | str]],
                    spec: MetricSpec) -> list[str]:
    """The comparison with the paper, in its units (points of the metric), on the same
    fractions of n as the paper's (10% to 40% and beyond)."""
    out = [f"The paper: {PAPER.citation}. Its experiment: {PAPER.setting}. It reports gains of "
           f"{PAPER.gain_10_to_40_points[0]:g} to {PAPER.gain_10_to_40_points[1]:g} points from "
           f"m = 10% to 40% of n and at most {PAPER.gain_beyond_40_points:g} points beyond, so "
           f"m* ≈ {PAPER.saturation_fraction:g} n."]
    first = [spec.points(float(g["gain_10_to_40"])) for g in gains
             if math.isfinite(float(g["gain_10_to_40"]))]
    second = [spec.points(float(g["gain_40_to_100"])) for g in gains
              if math.isfinite(float(g["gain_40_to_100"]))]
    if first and second:
        out.append(f"Here, over the same fractions of n and in the same units ({spec.unit} of "
                   f"{spec.name}): {min(first):+.2f} to {max(first):+.2f} from 10% to 40% of n "
                   f"and {min(second):+.2f} to {max(second):+.2f} from 40% to 100%, over "
                   "regimes and n.")
    else:
        out.append("The grid does not hold m = 10%, 40% and 100% of n for every n, so the "
                   "gains cannot be set beside the paper's.")
    located = sorted(((c.m_star / c.n, c.m_star, c) for c in cells if c.m_star is not None),
                     key=lambda t: t[0])
    if located:
        (_, m_low, low), (_, m_high, high) = located[0], located[-1]
        out.append(f"Where m* is located, it is {pct(m_low, low.n)} ({low.regime}, "
                   f"n = {low.n:,}) to {pct(m_high, high.n)} ({high.regime}, n = "
                   f"{high.n:,}) of its cell's n (the paper: about "
                   f"{100 * PAPER.saturation_fraction:g}%).")
    out.append("Our scale is far below the paper's (thousands of anchors on a CPU, not millions "
               "on GPUs), and the model and data differ, so agreement in shape, not in the "
               "exact numbers, is what to look for.")
    return out
