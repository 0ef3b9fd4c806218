"""One call per CLI command: run a study and write its report; rebuild a report from files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crl.errors import CrlValueError
from crl.experiments.executors.base import Executor
from crl.experiments.executors.registry import build_executor
from crl.experiments.registry import get_study, study_class
from crl.experiments.report import build_report
from crl.experiments.results import collect_results
from crl.experiments.runner import STUDY_FILE, StudyOutcome, open_study_dir, run_study
from crl.experiments.study import Analysis, Study, check_options, read_study_file
from crl.rundir import OutputDir, lock_directory


def _merge(first: StudyOutcome, later: StudyOutcome) -> StudyOutcome:
    first.total = later.total
    first.completed += later.completed
    first.failed += later.failed
    return first


def run_and_report(name: str, *, preset: str = "quick", out: str | Path = "runs",
                   workers: int | None = None, progress: bool = True,
                   executor: str | Executor | None = None, group_runs: bool = True,
                   force: bool = False, keep_weights: bool = False,
                   **options: Any) -> tuple[StudyOutcome, Analysis]:
    """Run the study ``name`` (skipping finished runs, resuming interrupted ones), then its
    refinement stages, and write ``results.csv``, ``analysis.json``, ``plots/`` and
    ``report.html``.

    The data and every run config are checked once, before any worker starts. ``executor``
    says where the runs execute: ``"local"`` (the default), ``"submitit"``, ``"ray"``, or an
    :class:`~crl.experiments.executors.Executor` with its settings (docs/distributed.md).
    ``group_runs`` trains the runs that differ only in their negatives together on the local
    executor (:mod:`crl.experiments.executors.grouping`; ``--no-group``: one at a time).
    The study directory is locked for the whole call, and one that records other options is
    refused unless ``force`` (:func:`~crl.experiments.runner.open_study_dir`). A finished run
    keeps its weights (``checkpoint.pt``) only with ``keep_weights``.

    Raises:
        CrlValueError: when some runs failed (how many, and the first failure's one-line
            error; the report is still written from the others when there are any).
        CrlError: when another process writes the study directory, or it holds a symbolic
            link.
    """
    if not isinstance(executor, Executor):
        executor = build_executor(executor or "local", workers=workers)
    study = get_study(name, preset=preset, **options)
    with open_study_dir(study, out, force=force) as study_dir:
        study.check(study_dir)
        outcome = run_study(study, out, progress=progress, executor=executor,
                            group_runs=group_runs, keep_weights=keep_weights)
        while not outcome.failed:
            rows = collect_results(study.runs(), outcome.study_dir, study.result_keys()).rows
            if not study.refine(rows, outcome.study_dir):
                break
            outcome = _merge(outcome, run_study(study, out, progress=progress,
                                                executor=executor, group_runs=group_runs,
                                                keep_weights=keep_weights))
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


def load_study(study_dir: str | Path) -> Study:
    """The study recorded in ``study_dir/study.json``, every key of the file checked.

    Raises:
        CrlValueError: one line naming the file and what is wrong in it (an unknown study,
            preset or option with the valid ones, an option of the wrong type or range).
    """
    path = Path(study_dir) / STUDY_FILE
    if not path.exists():
        raise CrlValueError(f"{study_dir} is not a study directory (no {STUDY_FILE}); "
                            "pass the directory `crl study` wrote, e.g. runs/negatives")
    described = read_study_file(path)
    try:
        cls = study_class(described.study)
    except CrlValueError as exc:
        raise CrlValueError(f"{path}: study: {exc}") from None
    check_options(cls.Options, described.options, where=str(path),
                  name=lambda option: f"options.{option}")
    try:  # what the options' types allow but the study refuses (an n below 2, a lost file)
        return cls(described.preset, **described.options)
    except CrlValueError as exc:
        raise CrlValueError(f"{path}: {exc}") from None


def rebuild_report(study_dir: str | Path, *, from_results: bool = False) -> Analysis:
    """Rebuild the report of the study in ``study_dir`` from its files alone
    (``study_dir/report.html``); returns its analysis. ``from_results``: from its
    ``results.csv`` (kept as it is) instead of its run directories.

    Raises:
        CrlError: when another process writes the study directory (a study running there), or
            it holds a symbolic link.
    """
    study = load_study(study_dir)
    with lock_directory(study_dir, blocking=False):
        OutputDir(study_dir).refuse_links(depth=2)
        return build_report(study, Path(study_dir), from_results=from_results)
