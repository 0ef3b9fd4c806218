"""One call per CLI command: run a study and write its report; rebuild a report from files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crl.errors import CrlValueError
from crl.experiments.executors.base import Executor
from crl.experiments.executors.registry import build_executor
from crl.experiments.registry import get_study
from crl.experiments.report import REPORT_FILE, build_report
from crl.experiments.results import collect_rows
from crl.experiments.runner import STUDY_FILE, StudyOutcome, prepare_study_dir, run_study
from crl.experiments.study import Analysis
from crl.rundir import read_json


def _merge(first: StudyOutcome, later: StudyOutcome) -> StudyOutcome:
    first.total = later.total
    first.completed += later.completed
    first.failed += later.failed
    return first


def run_and_report(name: str, *, preset: str = "quick", out: str | Path = "runs",
                   workers: int | None = None, progress: bool = True,
                   executor: str | Executor | None = None, group_runs: bool = True,
                   **options: Any) -> tuple[StudyOutcome, Analysis]:
    """Run the study ``name`` (skipping finished runs, resuming interrupted ones), then its
    refinement stages, and write ``results.csv``, ``analysis.json``, ``plots/`` and
    ``report.html``.

    The data and every run config are checked once, before any worker starts. ``executor``
    says where the runs execute: ``"local"`` (the default), ``"submitit"``, ``"ray"``, or an
    :class:`~crl.experiments.executors.Executor` with its settings (docs/distributed.md).
    ``group_runs`` trains the runs that differ only in their negatives together on the local
    executor (:mod:`crl.experiments.executors.grouping`; ``--no-group``: one at a time).

    Raises:
        CrlValueError: when some runs failed (how many, and the first failure's one-line
            error; the report is still written from the others when there are any).
    """
    if not isinstance(executor, Executor):
        executor = build_executor(executor or "local", workers=workers)
    study = get_study(name, preset=preset, **options)
    study_dir = prepare_study_dir(study, Path(out))  # one clear error if it cannot be written
    study.check(study_dir)
    outcome = run_study(study, out, progress=progress, executor=executor,
                        group_runs=group_runs)
    while not outcome.failed:
        rows = collect_rows(study.runs(), outcome.study_dir)
        if not study.refine(rows, outcome.study_dir):
            break
        outcome = _merge(outcome, run_study(study, out, progress=progress, executor=executor,
                                            group_runs=group_runs))
    if outcome.failed and outcome.completed + outcome.skipped == 0:
        raise CrlValueError(_failures(name, outcome, "all"))
    analysis = build_report(study, outcome.study_dir)
    if outcome.failed:
        raise CrlValueError(_failures(name, outcome, "some") + "; the report covers the others")
    return outcome, analysis


def _failures(name: str, outcome: StudyOutcome, which: str) -> str:
    first_id, first_message = outcome.failed[0]
    count = (f"all {outcome.total}" if which == "all"
             else f"{len(outcome.failed)} of {outcome.total}")
    return (f"study {name}: {count} runs failed; the first ({first_id}): {first_message} "
            f"(traceback in {outcome.study_dir / first_id / 'error.txt'})")


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
