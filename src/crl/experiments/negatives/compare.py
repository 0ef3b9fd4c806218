"""Two negatives studies side by side: do their recommendations agree? (``crl study compare``;
docs/negatives.md, "Two studies, one question").

The answer of a study holds for its question: the data, the metric, the tolerance, the target n
and the training (samples per run or epochs at every n, at a batch size). Two studies answer the
same question only when all of these match; then, per regime, they *agree* when each
recommendation lies within the other's 95% interval, and otherwise the comparison says why they
may differ (where each recommendation comes from, and what the verify stage measured). Where
both verify stages measured the answer at the target n, those measurements are compared too:
they agree when their brackets ``(below_m, measured_m]`` overlap, and the closing line
(:meth:`Comparison.verdict`) says when they agree though the grids' recommendations do not.
Reads ``analysis.json`` and ``study.json`` only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crl.errors import CrlValueError
from crl.rundir import read_json


@dataclass(frozen=True)
class RegimeComparison:
    """One regime's two recommendations: ``(m, low, high)`` each, and the verdict."""

    regime: str
    a: tuple[float | None, float, float]
    b: tuple[float | None, float, float]
    verdict: str
    why: str = ""
    measured: str = ""


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
    def measured_agree(self) -> bool | None:
        """Whether the verify stages' answers at the target n agree in every regime (None
        unless both studies measured every regime there)."""
        if self.mismatches or not self.regimes or any(not r.measured for r in self.regimes):
            return None
        return all(r.measured.endswith(": agree") for r in self.regimes)

    def verdict(self) -> str:
        """The closing line: ``agree``, ``do not agree``, or, when the two grids'
        recommendations differ but the answers measured at the target n agree, that.

        Example:
            >>> Comparison(Path("a"), Path("b"), ["data: x against y"]).verdict()
            'do not agree'
        """
        if self.agree:
            return "agree"
        if self.measured_agree:
            return ("do not agree on the grids' recommendations; the answers measured at the "
                    "target n (the configs to paste) agree")
        return "do not agree"

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
                       + (f"; {r.measured}" if r.measured else ""))
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
        return f"the {rec['source']} at n = {rec['n_used']:,}"
    parts = [f"A from {origin(ra)}, B from {origin(rb)}"]
    for name, rec in (("A", ra), ("B", rb)):
        verify = rec.get("verify")
        if verify:
            parts.append(f"{name} verified at n = {verify['target_n']:,}: m = "
                         f"{verify['m_rec']:,} {verify['verdict']} the tolerance of the best "
                         f"(m = {verify['best_m']:,})")
    return "; ".join(parts)


def _bracket(verify: dict[str, Any]) -> tuple[float, float]:
    below = verify.get("below_m")
    return (0.0 if below is None else float(below)), float(verify["measured_m"])


def measured_agreement(ra: dict[str, Any], rb: dict[str, Any]) -> str:
    """The two verify stages' answers at the target n side by side ("" unless both measured
    one): they agree when their brackets ``(below_m, measured_m]`` overlap.

    Example:
        >>> v = {"measured_m": 2000, "below_m": 1400}
        >>> measured_agreement({"verify": v}, {"verify": {"measured_m": 1400, "below_m": 1000}})
        'measured at the target n: A m = 2,000 (above 1,400), B m = 1,400 (above 1,000): disagree'
    """
    va, vb = ra.get("verify"), rb.get("verify")
    if not va or not vb or "measured_m" not in va or "measured_m" not in vb:
        return ""
    (la, ha), (lb, hb) = _bracket(va), _bracket(vb)
    verdict = "agree" if la < hb and lb < ha else "disagree"
    return (f"measured at the target n: A m = {ha:,.0f} (above {la:,.0f}), B m = {hb:,.0f} "
            f"(above {lb:,.0f}): {verdict}")


def _triple(rec: dict[str, Any]) -> tuple[float | None, float, float]:
    low = rec["low"] if rec["low"] is not None else 0.0
    high = rec["high"] if rec["high"] is not None else math.inf
    return rec["m"], float(low), float(high)


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
    for regime in sorted(set(na["recommendations"]) & set(nb["recommendations"])):
        ra, rb = na["recommendations"][regime], nb["recommendations"][regime]
        ta, tb = _triple(ra), _triple(rb)
        if ta[0] is None or tb[0] is None:
            verdict, why = "cannot tell", "a recommendation gives only bounds"
        elif tb[1] <= ta[0] <= tb[2] and ta[1] <= tb[0] <= ta[2]:
            verdict, why = "agree", "each within the other's interval"
        else:
            verdict, why = "disagree", _why(ra, rb)
        result.regimes.append(RegimeComparison(regime, ta, tb, verdict, why,
                                               measured_agreement(ra, rb)))
    return result
