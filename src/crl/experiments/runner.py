"""Run a study's grid: resumable, never a run twice, on the executor chosen once.

The state of a study is its directory only. A run whose ``summary.json`` exists is done and is
never redone; a run with a checkpoint resumes from it; a run being executed holds an exclusive
``flock`` on ``<run>/.lock``, so a re-run of a study whose earlier attempt is still alive (an
orphaned worker after ``kill -9`` of the parent, a job still running on the cluster) waits for
that run instead of doing it twice. The study directory itself has one writer: the process that
runs the study holds its lock (:func:`open_study_dir`), refuses a directory that records another
study's options, and writes nothing through a symbolic link. Where the runs execute (a local
process pool, a Slurm job array through submitit, Ray tasks) is an
:class:`~crl.experiments.executors.Executor`; the worker that runs one grid point is the same
under all of them (:func:`~crl.experiments.executors.run_task`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from crl.data.cache import prepare_data_caches
from crl.errors import CrlError, CrlValueError
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
from crl.rundir import OutputDir, as_written, lock_directory, read_json

STUDY_FILE = "study.json"

__all__ = ["ERROR_FILE", "SPEC_FILE", "STUDY_FILE", "StudyOutcome", "default_workers",
           "execute_run", "open_study_dir", "run_study"]


@dataclass
class StudyOutcome:
    """What :func:`run_study` did."""

    study_dir: Path
    total: int
    skipped: int
    completed: int
    failed: list[tuple[str, str]] = field(default_factory=list)


def _writable(study_dir: OutputDir) -> None:
    """Create the study directory, or say in one line why it cannot be written."""
    try:
        study_dir.mkdir()
        probe = study_dir.file(".write-test")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CrlValueError(
            f"cannot write the study directory {study_dir.path}: {exc.strerror or exc}; "
            "choose another one with --out DIR"
        ) from None


def _other_study(path: Path, described: dict[str, Any]) -> str | None:
    """What differs between the study ``study.json`` at ``path`` records and ``described``
    (None: nothing, or no file)."""
    if not path.exists():
        return None
    try:
        recorded = read_json(path)
    except CrlError as exc:
        return f"its {path.name} cannot be read ({exc})"
    wanted = as_written(described)
    fields = {"study": (recorded.get("study"), wanted["study"]),
              "preset": (recorded.get("preset"), wanted["preset"])}
    there, here = recorded.get("options", {}), wanted["options"]
    if isinstance(there, dict):
        fields |= {k: (there.get(k), here.get(k)) for k in sorted(set(there) | set(here))}
    else:
        fields["options"] = (there, here)
    differ = [f"{k} {a!r} there, {b!r} now" for k, (a, b) in fields.items() if a != b]
    return ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")


@contextmanager
def open_study_dir(study: Study, out_dir: str | Path, *,
                   force: bool = False) -> Iterator[Path]:
    """``out_dir/<study>`` for the block, with this process as its one writer: created (one
    clear error when it cannot be written), locked (a second ``crl study`` into it fails at
    once, naming this process), checked (no symbolic link in it or in its run directories: crl
    never writes through one; no ``study.json`` of other options unless ``force``), and the
    study's name, preset and options recorded in ``study.json``. Re-entrant in this thread.

    Raises:
        CrlError: when another process holds the lock, or the directory holds a link.
        CrlValueError: when it cannot be written, or records another study and not ``force``.
    """
    files = OutputDir(Path(out_dir) / study.name)
    files.file()  # the study directory itself is not a link (before anything is written)
    _writable(files)
    with lock_directory(files.path, blocking=False):
        files.refuse_links(depth=2)
        described = study.describe()
        other = _other_study(files.file(STUDY_FILE), described)
        if other and not force:
            raise CrlValueError(
                f"{files.path} holds a study with other options ({other}); re-run it with its "
                "own options, choose another --out, or pass --force to record these options "
                "there (finished runs of equal configs are kept and reused)")
        files.write_json(STUDY_FILE, described)
        yield files.path


def run_study(study: Study, out_dir: str | Path, *, workers: int | None = None,
              progress: bool = True, executor: Executor | None = None,
              group_runs: bool = True, force: bool = False,
              keep_weights: bool = False) -> StudyOutcome:
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
        force: Run even when the study directory records other options (see
            :func:`open_study_dir`).
        keep_weights: Keep each finished run's ``checkpoint.pt`` (default: a run keeps it only
            while it trains; :func:`~crl.experiments.executors.base.drop_weights`).

    Returns:
        A :class:`StudyOutcome`; failed runs are listed there (their traceback is in
        ``<run>/error.txt``) and do not stop the others.

    Raises:
        CrlError: as :func:`open_study_dir`.
    """
    executor = LocalExecutor(workers) if executor is None else executor
    with open_study_dir(study, out_dir, force=force) as study_dir:
        return _run_grid(study, study_dir, executor=executor, progress=progress,
                         group_runs=group_runs, keep_weights=keep_weights)


def _run_grid(study: Study, study_dir: Path, *, executor: Executor, progress: bool,
              group_runs: bool, keep_weights: bool) -> StudyOutcome:
    # Specs may share a run (equal configs, different tags): each run id is executed once.
    unique = list({s.run_id: s for s in study.runs()}.values())
    pending = [s for s in unique if not is_done(study_dir / s.run_id)]
    outcome = StudyOutcome(study_dir, total=len(unique), skipped=len(unique) - len(pending),
                           completed=0)
    # A missing data cache (mined pycode pairs) is filled once here, not by every worker.
    prepare_data_caches([s.config["data"] for s in pending
                         if isinstance(s.config.get("data"), dict)], progress=progress)
    tasks: list[Task] = [RunTask(study, spec, study_dir / spec.run_id, keep_weights=keep_weights)
                         for spec in pending]
    if group_runs and isinstance(executor, LocalExecutor):
        tasks = plan_tasks(study, pending, study_dir, workers=executor.workers,
                           keep_weights=keep_weights)
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
