"""What every executor shares: the task of one run, its outcome, the worker, the lock.

A study is a grid of independent runs whose whole state lives in their run directories (a run
whose ``summary.json`` exists is done; one with a checkpoint resumes from it; one being executed
holds an exclusive ``flock`` on ``<run>/.lock``). A finished run keeps its summary, metrics and
config; its weights (``checkpoint.pt``) only while it trains, unless the study is asked to keep
them (``keep_weights``, ``crl study NAME --keep-weights``): :func:`drop_weights` removes them
once ``summary.json`` is on disk. So the engine that runs them needs no scheduling
logic of crl's own: an :class:`Executor` is handed :class:`RunTask` objects, runs
:func:`run_task` on each somewhere, and yields each :class:`RunOutcome` as it comes back.
:func:`run_task` (the lock, the fit, the summary) is the same function under every engine:

- ``local``: :class:`~crl.experiments.executors.local.LocalExecutor`, a process pool on this
  machine (the default), which also trains groups of runs together
  (:class:`~crl.experiments.executors.grouping.GroupTask`);
- ``submitit``: :class:`~crl.experiments.executors.submitit.SubmititExecutor`, a Slurm job array
  through submitit, each run a job that is requeued after its time limit and resumes;
- ``ray``: :class:`~crl.experiments.executors.ray.RayExecutor`, Ray tasks on a local Ray or a
  cluster.

Each engine declares its own settings (:attr:`Executor.Options`, a dataclass of its flags) and
checks them when it is built; :mod:`crl.experiments.executors.registry` finds an engine by name.
See docs/distributed.md, "Studies on a Slurm or Ray cluster".
"""

from __future__ import annotations

import importlib
import os
import traceback
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self

from crl.errors import CrlError, CrlValueError
from crl.rundir import (
    CHECKPOINT_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    OutputDir,
    lock_directory,
    write_json,
)

if TYPE_CHECKING:  # the engines' flags are read by the CLI without the studies and the trainer
    from crl.experiments.study import RunSpec, Study

SPEC_FILE = "spec.json"
ERROR_FILE = "error.txt"


class Task(Protocol):
    """What an executor is handed: one run (:class:`RunTask`) or runs that train together
    (:class:`~crl.experiments.executors.grouping.GroupTask`), pickled to the worker whole."""

    @property
    def study(self) -> Study:
        """The study the runs belong to."""

    @property
    def specs(self) -> tuple[RunSpec, ...]:
        """The runs."""

    @property
    def run_dirs(self) -> tuple[Path, ...]:
        """Their run directories, in the order of :attr:`specs`."""

    @property
    def threads(self) -> int | None:
        """Torch threads for the task (None: leave the process's setting)."""

    @property
    def keep_weights(self) -> bool:
        """Keep a finished run's ``checkpoint.pt`` (False: :func:`drop_weights`)."""

    def with_threads(self, threads: int | None) -> Self:
        """The same task with ``threads`` torch threads."""

    def run(self) -> list[RunOutcome]:
        """Execute the task in this process: one outcome per run, in the order of :attr:`specs`
        (a failed run is an outcome, not an exception)."""


@dataclass(frozen=True)
class RunTask:
    """One grid point to execute somewhere (a :class:`Task`).

    Attributes:
        study: The study the run belongs to (its ``execute`` trains the run).
        spec: The run.
        run_dir: ``<study dir>/<run id>``; on a cluster, a path every node sees.
        threads: Torch threads for the run (None: leave the process's setting).
        keep_weights: Keep the finished run's ``checkpoint.pt`` (False: removed once its
            ``summary.json`` is written, :func:`drop_weights`).
    """

    study: Study
    spec: RunSpec
    run_dir: Path
    threads: int | None = None
    keep_weights: bool = False

    @property
    def specs(self) -> tuple[RunSpec, ...]:
        """The run, alone."""
        return (self.spec,)

    @property
    def run_dirs(self) -> tuple[Path, ...]:
        """Its run directory, alone."""
        return (self.run_dir,)

    def with_threads(self, threads: int | None) -> Self:
        """The same run with ``threads`` torch threads."""
        return replace(self, threads=threads)

    def run(self) -> list[RunOutcome]:
        """Execute the run (:func:`run_task`)."""
        return [run_task(self)]


@dataclass(frozen=True)
class RunOutcome:
    """What became of one run of a :class:`Task`.

    Attributes:
        run_id: The run.
        ran: True when this attempt trained the run to its summary; False when it was already
            done (another attempt finished it) or failed.
        error: None, or the first line of the failure (the traceback is in
            ``<run>/error.txt``).
    """

    run_id: str
    ran: bool
    error: str | None = None


def is_done(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` is finished (its ``summary.json`` exists)."""
    return (run_dir / SUMMARY_FILE).exists()


def lock_run(run_dir: Path) -> AbstractContextManager[None]:
    """Hold the run's write lock (``<run>/.lock``, :func:`crl.rundir.lock_directory`) for the
    block, waiting while another live attempt (an orphaned worker, a job still running on the
    cluster) holds it. ``fit``'s writer takes the same lock again in this thread (it is
    re-entrant), so a run is never written by two processes.

    Raises:
        CrlError: when the run directory is a symbolic link, or its file system has no working
            ``flock`` (the message says which).
    """
    return lock_directory(run_dir, blocking=True)


def drop_weights(run_dir: Path) -> None:
    """Remove the weights of the finished run in ``run_dir``: its ``checkpoint.pt`` and those
    of its sub-directories (a study that trains into ``<run>/train``), never through a link.

    Called only once the run's ``summary.json`` is on disk (written atomically and fsync'ed),
    so a resumed study sees the run finished, never half done; the summary, metrics and config
    stay.
    """
    if not is_done(run_dir):
        raise RuntimeError(f"drop_weights: {run_dir} holds no {SUMMARY_FILE}; its weights are "
                           "its state")
    folders = [run_dir, *(p for p in run_dir.iterdir() if p.is_dir() and not p.is_symlink())]
    for folder in folders:
        path = folder / CHECKPOINT_FILE
        if path.is_file() and not path.is_symlink():
            path.unlink()


def execute_run(study: Study, spec: RunSpec, run_dir: Path, *,
                keep_weights: bool = False) -> bool:
    """Run one grid point under its lock; returns False when it was already done. The finished
    run's weights are removed unless ``keep_weights`` (:func:`drop_weights`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with lock_run(run_dir):
        if is_done(run_dir):
            return False
        if not (run_dir / SPEC_FILE).exists():
            write_json(run_dir / SPEC_FILE, {"config": spec.config, "tags": spec.tags,
                                             "label": spec.label})
        # An attempt killed before its first checkpoint leaves metrics.jsonl: resuming
        # then starts the run over (fit refuses a non-empty directory without resume).
        resume = (run_dir / CHECKPOINT_FILE).exists() or (run_dir / METRICS_FILE).exists()
        study.execute(spec, run_dir, resume=resume)
        if not is_done(run_dir):
            raise RuntimeError(f"study {study.name}: run {spec.run_id} ended without "
                               f"writing {SUMMARY_FILE}")
        if not keep_weights:
            drop_weights(run_dir)
        (run_dir / ERROR_FILE).unlink(missing_ok=True)
        return True


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name when it has none)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def record_failure(run_dir: Path, exc: BaseException) -> str:
    """Write ``exc``'s traceback to ``<run>/error.txt``; return its first line."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:  # never through a symbolic link (the failure may be that the run directory is one)
        OutputDir(run_dir).write_text(ERROR_FILE, text)
    except (OSError, CrlError):
        pass
    return first_line(exc)


def lost_outcomes(task: Task, exc: BaseException, error: str) -> list[RunOutcome]:
    """The outcomes of a task its engine lost (the worker process, job or Ray task died): every
    run failed with ``error``, and ``exc``'s traceback is in each run's ``error.txt``."""
    for run_dir in task.run_dirs:
        record_failure(run_dir, exc)
    return [RunOutcome(spec.run_id, False, error) for spec in task.specs]


def run_task(task: RunTask) -> RunOutcome:
    """The worker of every executor: run one grid point under its lock (:func:`execute_run`).

    A failure is recorded in ``<run>/error.txt`` and returned, not raised, so that one bad run
    does not stop the others. ``KeyboardInterrupt`` and ``SystemExit`` (how submitit ends a job
    at its time limit, after requeueing it) go through: the lock is released and the run
    resumes from its last checkpoint in the next attempt.
    """
    import torch

    threads = torch.get_num_threads()
    if task.threads is not None:
        torch.set_num_threads(task.threads)
    try:
        ran = execute_run(task.study, task.spec, task.run_dir, keep_weights=task.keep_weights)
    except Exception as exc:
        return RunOutcome(task.spec.run_id, False, record_failure(task.run_dir, exc))
    finally:
        torch.set_num_threads(threads)
    return RunOutcome(task.spec.run_id, ran)


def check_gpus(where: str, gpus_per_run: int, tasks: Sequence[Task]) -> None:
    """GPUs reserved per run are for runs that train on CUDA (``--device cuda``)."""
    if gpus_per_run < 0:
        raise CrlValueError(f"{where} must be >= 0; got {gpus_per_run}")
    devices = {str(spec.config.get("train", {}).get("device", "cpu"))
               for task in tasks for spec in task.specs}
    if gpus_per_run and tasks and not any(d.startswith("cuda") for d in devices):
        raise CrlValueError(f"{where} {gpus_per_run} reserves GPUs for runs that train on CUDA "
                            f"(--device cuda), but these runs train on "
                            f"{', '.join(sorted(devices))}")


def default_workers() -> int:
    """The number of cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Flag:
    """The help of a flag of ``crl study NAME``, in the annotation of a field of an engine's
    :attr:`~Executor.Options`: ``ray_address: Annotated[str | None, Flag("...")] = None`` is
    ``--ray-address``.

    Attributes:
        help: The flag's help text (plain text).
        metavar: The flag's value in the help (None: typer's default).
    """

    help: str
    metavar: str | None = None


@dataclass(frozen=True)
class EngineOptions:
    """The settings of an engine beyond ``--workers``: subclasses are frozen dataclasses whose
    fields are the engine's flags, each annotated ``Annotated[T | None, Flag(...)]`` (``T`` as
    the flag takes it; ``list[str]`` for a repeatable flag) with the default None (not given)."""


class Executor(ABC):
    """Runs a study's tasks somewhere and reports each run as it ends.

    An engine declares its name (:attr:`kind`, :attr:`summary`), its flags (:attr:`Options`),
    the package it runs on (:attr:`requires`), and builds itself from them
    (:meth:`from_options`), checking them.
    """

    #: The executor's name (``--executor KIND``).
    kind: ClassVar[str] = ""
    #: What it is, in a few words (for ``--executor``'s help).
    summary: ClassVar[str] = ""
    #: The engine's flags beyond ``--workers`` (names unique across engines).
    Options: ClassVar[type[EngineOptions]] = EngineOptions
    #: The package the engine runs on and the extra of crl that installs it (None: none).
    requires: ClassVar[tuple[str, str] | None] = None

    @classmethod
    @abstractmethod
    def from_options(cls, workers: int | None, options: Any) -> Self:
        """The executor of ``--workers`` and ``options`` (an instance of :attr:`Options`).

        Raises:
            CrlValueError: for bad settings (the message names the flag).
        """

    @classmethod
    def import_engine(cls) -> ModuleType:
        """Import the package the engine runs on (:attr:`requires`).

        Raises:
            CrlValueError: when it is not installed (the message names the extra that installs
                it).
        """
        if cls.requires is None:
            raise TypeError(f"--executor {cls.kind} runs on no package of its own")
        module, extra = cls.requires
        try:
            return importlib.import_module(module)
        except ImportError:
            raise CrlValueError(f"--executor {cls.kind} needs {module}, which is not installed: "
                                f'pip install "crl[{extra}]"') from None

    @abstractmethod
    def run(self, tasks: Sequence[Task], study_dir: Path) -> Iterator[RunOutcome]:
        """Start every task and yield each run's outcome once it ends (in any order).

        Args:
            tasks: The unfinished runs of the study (single runs and groups).
            study_dir: The study directory (for the engine's own files, e.g. job logs).

        Raises:
            CrlValueError: when the tasks cannot run with this executor's settings (checked
                before any of them starts).
        """
