"""The negatives study's arms beside its grid: which arm a result row belongs to, the control
arm's and the verify stage's results from the rows, and why either has none."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from crl.experiments.negatives.control import ControlResult, control_result
from crl.experiments.negatives.options import VERIFY_FILE
from crl.experiments.negatives.stats import REGIMES
from crl.experiments.negatives.verify import VerifyResult, verify_result

if TYPE_CHECKING:
    from crl.experiments.negatives.study import NegativesStudy


def arm(row: dict[str, Any]) -> str:
    """Which arm a result row belongs to: ``main`` (the grid and its refinement), ``control``
    or ``verify`` (the ``arm`` tag; rows written before there were arms are ``main``)."""
    value = row.get("arm")
    return value if isinstance(value, str) and value else "main"


def control_results(study: NegativesStudy, rows: list[dict[str, Any]]) -> list[ControlResult]:
    """The control arm's verdict per regime from the rows of every arm."""
    if not study.control:
        return []
    main = [r for r in rows if arm(r) == "main"]
    ctrl = [r for r in rows if arm(r) == "control"]
    found = [control_result(main, ctrl, study.metric, study.spec.higher_is_better,
                            study.tolerance, regime=regime, n=study.control_n,
                            batch=study.grid.batch(study.control_n),
                            control_batch=study.control_batch) for regime in REGIMES]
    return [c for c in found if c is not None]


def verify_results(study: NegativesStudy, rows: list[dict[str, Any]]) -> list[VerifyResult]:
    """The verify stage's measurement per regime from the rows of every arm."""
    mine = [r for r in rows if arm(r) == "verify"]
    found = [verify_result(p, mine, study.metric, study.spec.higher_is_better,
                           study.tolerance) for p in study.verify_plans]
    return [v for v in found if v is not None]


def target_rows(results: list[VerifyResult], rows: list[dict[str, Any]]
                ) -> list[dict[str, Any]]:
    """The verify runs each result reads (its regime, the target n, its paired seeds): the
    rows of the recommendation's cells at the target n (:mod:`.answer`)."""
    keep = {(r.plan.regime, r.plan.target_n): set(r.seeds) for r in results}
    return [row for row in rows if arm(row) == "verify"
            and int(row["seed"]) in keep.get((str(row.get("regime")), int(row["n"])), set())]


def verify_note(study: NegativesStudy, study_dir: Path) -> str:
    """Why the verify stage has no result, completing a sentence."""
    if not study.verify:
        return "was not run (`--verify` runs it)."
    if not (study_dir / VERIFY_FILE).exists():
        return "has not been planned yet: it follows the refinement."
    if not study.verify_plans:
        return ("had nothing to measure: no regime's recommendation gives an m (only an "
                "upper bound).")
    return "has no finished runs at m_rec and another m on a common seed yet."


def control_note(study: NegativesStudy) -> str:
    """Why the control arm has no result, completing a sentence."""
    if not study.control:
        return "was not run (`--control` runs it)."
    return (f"has no result: it needs finished runs in both arms at >= 3 of the swept m "
            f"whose m / {study.grid.batch(study.control_n) / study.control_batch:g} lies in "
            "the swept range.")
