"""Two negatives studies side by side: do their recommendations agree? (``crl study compare``;
docs/negatives.md, "Two studies, one question").

The answer of a study holds for its question: the data, the metric, the tolerance, the target n
and the training (samples per run or epochs at every n, at a batch size). Two studies answer the
same question only when all of these match; then, per regime, they *agree* when each
recommendation lies within the other's 95% interval, and otherwise the comparison says why they
may differ (where each recommendation comes from, and what the verify stage measured). A study
whose verify stage ran recommends the m* it measured at the target n (:mod:`.answer`); the
grid's prediction there is kept beside it, and where both studies have one the predictions are
compared too, by the same rule, and the closing line (:meth:`Comparison.verdict`) says whether
they agree as well. Reads ``analysis.json`` and ``study.json``.

Where both recommendations were measured at the target n and both directories hold their
``results.csv``, the two verify stages' runs are one sample of one question: the same data,
training and seeds give the same runs (a run both trained must score the same in both, or they
are not pooled), and the studies differ only in the m their grids led them to. Those runs are
then read as one cell per regime (:func:`pooled_cells`, the reading of every cell), and the
comparison says whether that reading's interval holds each study's m: where the two disagree,
whether the difference lies in the runs or in the m each measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crl.errors import CrlValueError
from crl.experiments.metrics import metric_spec, with_study_metric
from crl.experiments.negatives.curves import CurveCell, curve_cells
from crl.experiments.negatives.tolerance import Tolerance
from crl.experiments.results import read_results
from crl.rundir import read_json


@dataclass(frozen=True)
class RegimeComparison:
    """One regime's two recommendations: ``(m, low, high)`` each, and the verdict."""

    regime: str
    a: tuple[float | None, float, float]
    b: tuple[float | None, float, float]
    verdict: str
    why: str = ""
    predicted: str = ""
    predictions_agree: bool | None = None
    pooled: str = ""


@dataclass
class Comparison:
    """The comparison of studies ``a`` and ``b``.

    Attributes:
        a, b: The study directories. mismatches: How their questions differ (empty: the
            same question). regimes: Per regime, when the questions match.
    """

    a: Path
    b: Path
    mismatches: list[str] = field(default_factory=list)
    regimes: list[RegimeComparison] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        """The same question and every regime agrees."""
        return not self.mismatches and all(r.verdict == "agree" for r in self.regimes)

    @property
    def predictions_agree(self) -> bool | None:
        """Whether the grids' predictions at the target n agree in every regime (None unless
        both studies' recommendations were measured there, each with its prediction)."""
        found = [r.predictions_agree for r in self.regimes]
        if self.mismatches or not found or any(f is None for f in found):
            return None
        return all(found)

    def verdict(self) -> str:
        """The closing line: ``agree`` or ``do not agree``, and, where the recommendations
        were measured at the target n, whether the grids' predictions agree too.

        Example:
            >>> Comparison(Path("a"), Path("b"), ["data: x against y"]).verdict()
            'do not agree'
        """
        words = "agree" if self.agree else "do not agree"
        if self.predictions_agree is False:
            words += ("; the grids' predictions at the target n, before the verify stages "
                      "measured it, do not agree")
        elif self.predictions_agree:
            words += "; the grids' predictions at the target n agree too"
        return words

    def lines(self) -> list[str]:
        """The comparison in words, one line each."""
        if self.mismatches:
            return [f"not comparable: {self.a} and {self.b} answer different questions: "
                    + "; ".join(self.mismatches)]
        out = []
        for r in self.regimes:
            line = (f"{r.regime}: {r.verdict}: A m = {_m(r.a[0])} [{_m(r.a[1])}, {_m(r.a[2])}], "
                    f"B m = {_m(r.b[0])} [{_m(r.b[1])}, {_m(r.b[2])}]")
            out.append(line + (f" ({r.why})" if r.why else "")
                       + (f"; {r.predicted}" if r.predicted else "")
                       + (f"; {r.pooled}" if r.pooled else ""))
        return out


def _m(value: float | None) -> str:
    if value is None:
        return "—"
    return "∞" if math.isinf(value) else f"{value:,.0f}"


def _read(study_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    for name in ("study.json", "analysis.json"):
        if not (study_dir / name).exists():
            raise CrlValueError(f"study compare: {study_dir} has no {name}; pass directories "
                                "`crl study negatives` wrote (with their report)")
    study = read_json(study_dir / "study.json")
    if study.get("study") != "negatives":
        raise CrlValueError(f"study compare: {study_dir} is a {study.get('study')!r} study; "
                            "expected a negatives study")
    return study, read_json(study_dir / "analysis.json")["numbers"]


def training(numbers: dict[str, Any]) -> str:
    """A study's training in words, from its ``budget``: samples per run or epochs at every n,
    and the batch (results written before the mode was recorded are in samples).

    Example:
        >>> training({"budget": {"samples_per_run": 12000, "batch_size": 128}})
        '12,000 samples per run at batch 128'
    """
    budget = numbers.get("budget", {})
    if budget.get("mode", "samples") == "epochs":
        amount = f"{budget['target_epochs']:g} epochs at every n"
    else:
        amount = f"{budget['samples_per_run']:,} samples per run"
    return f"{amount} at batch {budget.get('batch_size')}"


def _question(study: dict[str, Any], numbers: dict[str, Any]) -> dict[str, Any]:
    options = study.get("options", {})
    return {"data": options.get("config") or options.get("data"), "metric": numbers["metric"],
            "tolerance": numbers["tolerance"]["text"], "target n": numbers["target_n"],
            "training": training(numbers)}


def _why(ra: dict[str, Any], rb: dict[str, Any]) -> str:
    """What differs between two recommendations that disagree."""
    def origin(rec: dict[str, Any]) -> str:
        if rec["source"] == "law":
            return "the law m*(n)" + (" (extrapolated)" if rec["extrapolation"] else "")
        if rec["source"] == "verify stage":
            return f"the verify stage's runs at n = {rec['n_used']:,}"
        return f"the {rec['source']} at n = {rec['n_used']:,}"
    parts = [f"A from {origin(ra)}, B from {origin(rb)}"]
    (ma, la, ha), (mb, lb, hb) = _triple(ra), _triple(rb)
    if max(la, lb) <= min(ha, hb):
        inside = [name for name, m, lo, hi in (("A", ma, lb, hb), ("B", mb, la, ha))
                  if m is not None and lo <= m <= hi]
        which = ("neither m lies in the other's" if not inside else
                 f"only {inside[0]}'s m lies in the other's")
        parts.append(f"the intervals overlap on [{_m(max(la, lb))}, {_m(min(ha, hb))}], but "
                     + which)
    for name, rec in (("A", ra), ("B", rb)):
        verify = rec.get("verify")
        if verify:
            parts.append(f"{name} verified at n = {verify['target_n']:,}: the prediction m = "
                         f"{verify['m_rec']:,} {verify['verdict']} the tolerance of the best "
                         f"(m = {verify['best_m']:,})")
    return "; ".join(parts)


def _agree(ta: tuple[float | None, float, float], tb: tuple[float | None, float, float]
           ) -> bool | None:
    """Each value within the other's interval; where one gives only bounds, the other's value
    within them; None when both give only bounds.

    Example:
        >>> _agree((6000.0, 5000.0, 7000.0), (None, 4000.0, 18000.0))
        True
    """
    if tb[0] is None:
        return None if ta[0] is None else tb[1] <= ta[0] <= tb[2]
    if ta[0] is None:
        return ta[1] <= tb[0] <= ta[2]
    return tb[1] <= ta[0] <= tb[2] and ta[1] <= tb[0] <= ta[2]


def predicted_agreement(ra: dict[str, Any], rb: dict[str, Any]) -> tuple[str, bool | None]:
    """The two grids' predictions at the target n side by side, where both recommendations
    were measured there and kept their predictions (``("", None)`` otherwise), by the rule of
    the recommendations (each within the other's interval).

    Example:
        >>> a = {"prediction": {"m": 700, "low": 500, "high": 900}}
        >>> b = {"prediction": {"m": 6000, "low": 4000, "high": 9000}}
        >>> predicted_agreement(a, b)[0]
        "the grids' predictions: A m = 700 [500, 900], B m = 6,000 [4,000, 9,000]: disagree"
    """
    pa, pb = ra.get("prediction"), rb.get("prediction")
    if not pa or not pb:
        return "", None
    ta, tb = _triple(pa), _triple(pb)
    agree = _agree(ta, tb)
    verdict = "cannot tell" if agree is None else "agree" if agree else "disagree"
    return (f"the grids' predictions: A m = {_m(ta[0])} [{_m(ta[1])}, {_m(ta[2])}], B m = "
            f"{_m(tb[0])} [{_m(tb[1])}, {_m(tb[2])}]: {verdict}", agree)


def _triple(rec: dict[str, Any]) -> tuple[float | None, float, float]:
    low = rec["low"] if rec["low"] is not None else 0.0
    high = rec["high"] if rec["high"] is not None else math.inf
    return rec["m"], float(low), float(high)


def pooled_cells(a: Path, b: Path, numbers: dict[str, Any]
                 ) -> tuple[dict[str, CurveCell], dict[str, int], str]:
    """Both studies' verify runs at the target n read as one cell per regime (module
    docstring), for studies of the same question (``numbers``: either's ``analysis.json``
    numbers).

    Returns:
        ``(cells by regime, runs both trained by regime, why not)``: no cells and the reason
        when a directory has no ``results.csv`` or a run both trained scores differently in
        each.
    """
    paths = [d / "results.csv" for d in (a, b)]
    if not all(p.exists() for p in paths):
        return {}, {}, "a study directory has no results.csv"
    metric, target = str(numbers["metric"]), int(numbers["target_n"])
    runs: dict[tuple[str, int, int], dict[str, Any]] = {}
    shared: dict[str, int] = {}
    differ = 0
    for path in paths:
        for row in read_results(path):
            if row.get("arm") != "verify" or int(row["n"]) != target:
                continue
            row = with_study_metric(row, metric)
            key = (str(row["regime"]), int(row["m"]), int(row["seed"]))
            if key in runs:
                shared[key[0]] = shared.get(key[0], 0) + 1
                before, now = runs[key][metric], row[metric]
                differ += before != now and not (before != before and now != now)  # NaN twice
            else:
                runs[key] = row
    if differ:
        return {}, shared, (f"{differ} of the {sum(shared.values())} runs both studies trained "
                            "at the target n score differently: they are not one sample")
    tolerance = Tolerance.parse(str(numbers["tolerance"]["text"]))
    cells = curve_cells(list(runs.values()), metric, metric_spec(metric).higher_is_better,
                        tolerance)
    return {c.regime: c for c in cells}, shared, ""


def _pooled_text(cell: CurveCell, shared: int, ta: tuple[float | None, float, float],
                 tb: tuple[float | None, float, float]) -> str:
    """The pooled reading of one regime in words, and which study's m its interval holds."""
    holds = [name for name, t in (("A", ta), ("B", tb))
             if t[0] is not None and cell.lower <= t[0] <= cell.upper]
    which = ("holds both m" if len(holds) == 2 else f"holds {holds[0]}'s m only" if holds
             else "holds neither m")
    point = (f"m* = {_m(cell.m_star)} [{_m(cell.lower)}, {_m(cell.upper)}]"
             if cell.m_star is not None else
             f"m* only bounded: [{_m(cell.lower)}, {_m(cell.upper)}]")
    return (f"both verify stages' runs read as one cell ({len(cell.ms)} m, {len(cell.seeds)} "
            f"seeds; the {shared} runs both trained score the same in each): {point}, which "
            f"{which}")


def compare_studies(a: str | Path, b: str | Path) -> Comparison:
    """Compare the recommendations of the negatives studies in ``a`` and ``b``.

    Raises:
        CrlValueError: when a directory is not a negatives study with a report.
    """
    a, b = Path(a), Path(b)
    (sa, na), (sb, nb) = _read(a), _read(b)
    qa, qb = _question(sa, na), _question(sb, nb)
    result = Comparison(a, b)
    for key in qa:
        if qa[key] != qb[key]:
            result.mismatches.append(f"{key}: {qa[key]} against {qb[key]}")
    if result.mismatches:
        return result
    measured = all(rec.get("source") == "verify stage" for numbers in (na, nb)
                   for rec in numbers["recommendations"].values())
    pooled, shared, why_not = pooled_cells(a, b, na) if measured else ({}, {}, "")
    for regime in sorted(set(na["recommendations"]) & set(nb["recommendations"])):
        ra, rb = na["recommendations"][regime], nb["recommendations"][regime]
        ta, tb = _triple(ra), _triple(rb)
        agree = _agree(ta, tb)
        if agree is None:
            verdict, why = "cannot tell", "both recommendations give only bounds"
        elif agree:
            verdict = "agree"
            why = ("each within the other's interval" if ta[0] is not None and tb[0] is not None
                   else f"{'A' if ta[0] is None else 'B'} gives only bounds, and the other's m "
                        "lies within them")
        else:
            verdict, why = "disagree", _why(ra, rb)
        predicted, predictions_agree = predicted_agreement(ra, rb)
        together = (_pooled_text(pooled[regime], shared.get(regime, 0), ta, tb)
                    if regime in pooled
                    else f"not pooled: {why_not}" if why_not else "")
        result.regimes.append(RegimeComparison(regime, ta, tb, verdict, why, predicted,
                                               predictions_agree, together))
    return result
