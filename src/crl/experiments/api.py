"""One call per CLI command: run a study and write its report; rebuild a report from files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crl.errors import CrlValueError
from crl.experiments.executors import Executor, build_executor
from crl.experiments.registry import get_study
from crl.experiments.report import REPORT_FILE, build_report
from crl.experiments.runner import STUDY_FILE, StudyOutcome, run_study
from crl.experiments.study import Analysis
from crl.rundir import read_json


def run_and_report(name: str, *, preset: str = "quick", out: str | Path = "runs",
                   workers: int | None = None, progress: bool = True,
                   executor: str | Executor | None = None,
                   **options: Any) -> tuple[StudyOutcome, Analysis]:
    """Run the study ``name`` (skipping finished runs, resuming interrupted ones) and write
    ``results.csv``, ``analysis.json``, ``plots/`` and ``report.html``.

    ``executor`` says where the runs execute: ``"local"`` (the default), ``"submitit"``,
    ``"ray"``, or an :class:`~crl.experiments.executors.Executor` with its settings
    (docs/distributed.md).

    Raises:
        CrlValueError: when some runs failed (the report is still written from the others).
    """
    if not isinstance(executor, Executor):
        executor = build_executor(executor or "local", workers=workers)
    study = get_study(name, preset=preset, **options)
    outcome = run_study(study, out, progress=progress, executor=executor)
    analysis = build_report(study, outcome.study_dir)
    if outcome.failed:
        first_id, first_message = outcome.failed[0]
        raise CrlValueError(
            f"study {name}: {len(outcome.failed)} of {outcome.total} runs failed (first: "
            f"{first_id}: {first_message}); see <run>/error.txt; the report covers the others"
        )
    return outcome, analysis


def rebuild_report(study_dir: str | Path) -> Path:
    """Rebuild the report of the study in ``study_dir`` from its files alone."""
    study_dir = Path(study_dir)
    if not (study_dir / STUDY_FILE).exists():
        raise CrlValueError(f"{study_dir} is not a study directory (no {STUDY_FILE}); "
                            "pass the directory `crl study` wrote, e.g. runs/negatives")
    described = read_json(study_dir / STUDY_FILE)
    study = get_study(str(described["study"]), preset=str(described["preset"]),
                      **dict(described.get("options", {})))
    build_report(study, study_dir)
    return study_dir / REPORT_FILE
