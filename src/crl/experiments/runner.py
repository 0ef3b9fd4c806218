"""Run a study's grid: resumable, never a run twice, on the executor chosen once.

The state of a study is its directory only. A run whose ``summary.json`` exists is done and is
never redone; a run with a checkpoint resumes from it; a run being executed holds an exclusive
``flock`` on ``<run>/.lock``, so a re-run of a study whose earlier attempt is still alive (an
orphaned worker after ``kill -9`` of the parent, a job still running on the cluster) waits for
that run instead of doing it twice. Where the runs execute (a local process pool, a Slurm job
array through submitit, Ray tasks) is an :class:`~crl.experiments.executors.Executor`; the
worker that runs one grid point is the same under all of them
(:func:`~crl.experiments.executors.run_task`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from crl.data.cache import prepare_data_caches
from crl.errors import CrlValueError
from crl.experiments.executors.base import (
    ERROR_FILE,
    SPEC_FILE,
    Executor,
    RunTask,
    Task,
    default_workers,
    execute_run,
    is_done,
)
from crl.experiments.executors.grouping import plan_tasks
from crl.experiments.executors.local import LocalExecutor
from crl.experiments.study import Study
from crl.rundir import write_json

STUDY_FILE = "study.json"

__all__ = ["ERROR_FILE", "SPEC_FILE", "STUDY_FILE", "StudyOutcome", "default_workers",
           "execute_run", "prepare_study_dir", "run_study"]


@dataclass
class StudyOutcome:
    """What :func:`run_study` did."""

    study_dir: Path
    total: int
    skipped: int
    completed: int
    failed: list[tuple[str, str]] = field(default_factory=list)


def prepare_study_dir(study: Study, out_dir: Path) -> Path:
    """Create ``out_dir/<study>`` (with a clear error when it cannot be written) and record
    the study's name, preset and options in ``study.json``."""
    study_dir = Path(out_dir) / study.name
    try:
        study_dir.mkdir(parents=True, exist_ok=True)
        probe = study_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CrlValueError(
            f"cannot write the study directory {study_dir}: {exc.strerror or exc}; "
            "choose another one with --out DIR"
        ) from None
    write_json(study_dir / STUDY_FILE, study.describe())
    return study_dir


def run_study(study: Study, out_dir: str | Path, *, workers: int | None = None,
              progress: bool = True, executor: Executor | None = None,
              group_runs: bool = True) -> StudyOutcome:
    """Run every unfinished run of ``study`` into ``out_dir/<study.name>/<run_id>/``.

    Args:
        study: The study.
        out_dir: The parent of the study directory (on a cluster: a shared file system).
        workers: Parallel processes of the default local executor (default: the number of
            cores; 1 runs in this process). Ignored when ``executor`` is given.
        progress: Show one overall progress bar.
        executor: Where the runs execute (default: ``LocalExecutor(workers)``); see
            :func:`crl.experiments.executors.build_executor`.
        group_runs: On the local executor, train the runs that differ only in their negatives
            together (:mod:`crl.experiments.executors.grouping`; the same run directories);
            False: one run at a time.

    Returns:
        A :class:`StudyOutcome`; failed runs are listed there (their traceback is in
        ``<run>/error.txt``) and do not stop the others.
    """
    executor = LocalExecutor(workers) if executor is None else executor
    study_dir = prepare_study_dir(study, Path(out_dir))
    # Specs may share a run (equal configs, different tags): each run id is executed once.
    unique = list({s.run_id: s for s in study.runs()}.values())
    pending = [s for s in unique if not is_done(study_dir / s.run_id)]
    outcome = StudyOutcome(study_dir, total=len(unique), skipped=len(unique) - len(pending),
                           completed=0)
    # A missing data cache (mined pycode pairs) is filled once here, not by every worker.
    prepare_data_caches([s.config["data"] for s in pending
                         if isinstance(s.config.get("data"), dict)], progress=progress)
    tasks: list[Task] = [RunTask(study, spec, study_dir / spec.run_id) for spec in pending]
    if group_runs and isinstance(executor, LocalExecutor):
        tasks = plan_tasks(study, pending, study_dir, workers=executor.workers)
    columns = (TextColumn(f"[bold]study {study.name}[/] ({study.preset}, {executor.kind})"),
               BarColumn(), MofNCompleteColumn(), TextColumn("runs"), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, disable=not progress, transient=False) as bar:
        task = bar.add_task("runs", total=len(unique), completed=outcome.skipped)
        for result in executor.run(tasks, study_dir):
            if result.error is not None:
                outcome.failed.append((result.run_id, result.error))
            else:  # trained here, or finished meanwhile by another live attempt
                outcome.completed += 1
            bar.advance(task)
    return outcome
