"""What every executor shares: the task of one run, its outcome, the worker, the lock.

A study is a grid of independent runs whose whole state lives in their run directories (a run
whose ``summary.json`` exists is done; one with a checkpoint resumes from it; one being executed
holds an exclusive ``flock`` on ``<run>/.lock``). So the engine that runs them needs no scheduling
logic of crl's own: an :class:`Executor` is handed :class:`RunTask` objects, runs
:func:`run_task` on each somewhere, and yields each :class:`RunOutcome` as it comes back.
:func:`run_task` (the lock, the fit, the summary) is the same function under every engine:

- ``local``: :class:`~crl.experiments.executors.local.LocalExecutor`, a process pool on this
  machine (the default);
- ``submitit``: :class:`~crl.experiments.executors.submitit.SubmititExecutor`, a Slurm job array
  through submitit, each run a job that is requeued after its time limit and resumes;
- ``ray``: :class:`~crl.experiments.executors.ray.RayExecutor`, Ray tasks on a local Ray or a
  cluster.

See docs/distributed.md, "Studies on a Slurm or Ray cluster".
"""

from __future__ import annotations

import errno
import fcntl
import importlib
import os
import traceback
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, ClassVar

from crl.errors import CrlError, CrlValueError
from crl.experiments.study import RunSpec, Study
from crl.rundir import CHECKPOINT_FILE, METRICS_FILE, SUMMARY_FILE, write_json

SPEC_FILE = "spec.json"
ERROR_FILE = "error.txt"
LOCK_FILE = ".lock"
#: The optional extra that installs each engine.
EXTRAS = {"submitit": ("submitit", "slurm"), "ray": ("ray", "ray")}


@dataclass(frozen=True)
class RunTask:
    """One grid point to execute somewhere (pickled to the worker, so the study travels whole).

    Attributes:
        study: The study the run belongs to (its ``execute`` trains the run).
        spec: The run.
        run_dir: ``<study dir>/<run id>``; on a cluster, a path every node sees.
        threads: Torch threads for the run (None: leave the process's setting).
    """

    study: Study
    spec: RunSpec
    run_dir: Path
    threads: int | None = None


@dataclass(frozen=True)
class RunOutcome:
    """What became of one :class:`RunTask`.

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


def lock_run(handle: IO[bytes], run_dir: Path) -> None:
    """Hold an exclusive lock on the run's open lock file (``<run>/.lock``) until it is unlocked
    or closed, waiting while another live attempt (an orphaned worker, a job still running on
    the cluster) holds it.

    Args:
        handle: ``<run>/.lock``, opened for writing.
        run_dir: The run directory (named in the error).

    Raises:
        CrlError: when the file system has no working ``flock`` (the message says which).
    """
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)  # waits for another live attempt at this run
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise CrlError(
                f"cannot lock {run_dir / LOCK_FILE}: {exc.strerror}; the study directory must "
                "lie on a file system with working flock locks (NFS with its lock service, "
                "Lustre mounted with -o flock; see docs/distributed.md)") from None
        raise


def execute_run(study: Study, spec: RunSpec, run_dir: Path) -> bool:
    """Run one grid point under its lock; returns False when it was already done."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK_FILE, "a+b") as lock:
        lock_run(lock, run_dir)
        try:
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
            (run_dir / ERROR_FILE).unlink(missing_ok=True)
            return True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def record_failure(run_dir: Path, exc: BaseException) -> str:
    """Write ``exc``'s traceback to ``<run>/error.txt``; return its first line."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / ERROR_FILE).write_text(text, encoding="utf-8")
    except OSError:
        pass
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


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
        ran = execute_run(task.study, task.spec, task.run_dir)
    except Exception as exc:
        return RunOutcome(task.spec.run_id, False, record_failure(task.run_dir, exc))
    finally:
        torch.set_num_threads(threads)
    return RunOutcome(task.spec.run_id, ran)


def require_extra(kind: str) -> ModuleType:
    """Import the engine of the executor ``kind``, or say in one line which extra installs it.

    Raises:
        CrlValueError: when the engine is not installed.
    """
    module, extra = EXTRAS[kind]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise CrlValueError(f"--executor {kind} needs {module}, which is not installed: "
                            f'pip install "crl[{extra}]"') from None


def check_gpus(where: str, gpus_per_run: int, tasks: Sequence[RunTask]) -> None:
    """GPUs reserved per run are for runs that train on CUDA (``--device cuda``)."""
    if gpus_per_run < 0:
        raise CrlValueError(f"{where} must be >= 0; got {gpus_per_run}")
    devices = {str(t.spec.config.get("train", {}).get("device", "cpu")) for t in tasks}
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


class Executor(ABC):
    """Runs a study's runs somewhere and reports each one as it ends."""

    #: The executor's name (``--executor KIND``).
    kind: ClassVar[str] = ""

    @abstractmethod
    def run(self, tasks: Sequence[RunTask], study_dir: Path) -> Iterator[RunOutcome]:
        """Start every task and yield each one's outcome once it ends (in any order).

        Args:
            tasks: The unfinished runs of the study.
            study_dir: The study directory (for the engine's own files, e.g. job logs).

        Raises:
            CrlValueError: when the tasks cannot run with this executor's settings (checked
                before any of them starts).
        """
