"""Where a study's runs execute: one small interface, three engines, chosen once.

A study is a grid of independent runs whose whole state lives in their run directories (a run
whose ``summary.json`` exists is done; one with a checkpoint resumes from it; one being executed
holds an exclusive ``flock`` on ``<run>/.lock``). So the engine that runs them needs no scheduling
logic of crl's own: an :class:`Executor` is handed :class:`RunTask` objects, runs
:func:`run_task` on each somewhere, and yields each :class:`RunOutcome` as it comes back.
:func:`run_task` (the lock, the fit, the summary) is the same function under every engine:

- ``local``: :class:`LocalExecutor`, a process pool on this machine (the default);
- ``submitit``: :class:`~crl.experiments.executors_submitit.SubmititExecutor`, a Slurm job array
  through submitit, each run a job that is requeued after its time limit and resumes;
- ``ray``: :class:`~crl.experiments.executors_ray.RayExecutor`, Ray tasks on a local Ray or a
  cluster.

See docs/distributed.md, "Studies on a Slurm or Ray cluster".
"""

from __future__ import annotations

import errno
import fcntl
import importlib
import multiprocessing
import os
import traceback
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from crl._validation import check_choice
from crl.errors import CrlError, CrlValueError
from crl.experiments.study import RunSpec, Study
from crl.rundir import CHECKPOINT_FILE, METRICS_FILE, SUMMARY_FILE, write_json

SPEC_FILE = "spec.json"
ERROR_FILE = "error.txt"
LOCK_FILE = ".lock"
#: The executors by name (``crl study NAME --executor KIND``).
EXECUTORS: tuple[str, ...] = ("local", "submitit", "ray")
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


def _lock(handle: Any, run_dir: Path) -> None:
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
        _lock(lock, run_dir)
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


class LocalExecutor(Executor):
    """A process pool on this machine: ``workers`` runs at once, each with ``cores // workers``
    torch threads (``workers=1``: one run after the other in this process)."""

    kind = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = default_workers() if workers is None else workers
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise CrlValueError(f"--workers must be an integer >= 1; got {workers!r}")

    def run(self, tasks: Sequence[RunTask], study_dir: Path) -> Iterator[RunOutcome]:
        """Also takes groups of runs (:class:`crl.experiments.grouping.GroupTask`)."""
        if self.workers == 1 or len(tasks) <= 1:
            for task in tasks:
                yield from run_tasks(task)
            return
        threads = max(1, default_workers() // self.workers)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=self.workers, mp_context=context) as pool:
            futures: dict[Future[list[RunOutcome]], RunTask] = {
                pool.submit(run_tasks, replace(task, threads=threads)): task for task in tasks}
            remaining = set(futures)
            try:
                while remaining:
                    done, remaining = wait(remaining, timeout=1.0, return_when=FIRST_COMPLETED)
                    for future in done:
                        yield from _outcomes(future, futures[future])
            except BaseException:  # Ctrl-C, or the caller stopped listening
                for future in remaining:
                    future.cancel()
                raise


def run_tasks(task: Any) -> list[RunOutcome]:
    """:func:`run_task` of a :class:`RunTask`, or the outcomes of a group of runs (an object
    with ``run()``: :class:`crl.experiments.grouping.GroupTask`)."""
    return [run_task(task)] if isinstance(task, RunTask) else list(task.run())


def _outcomes(future: Future[list[RunOutcome]], task: Any) -> list[RunOutcome]:
    try:
        return future.result()
    except Exception as exc:  # the worker process died (BrokenProcessPool)
        pairs = ([(task.spec, task.run_dir)] if isinstance(task, RunTask)
                 else list(zip(task.specs, task.run_dirs, strict=True)))
        return [RunOutcome(spec.run_id, False, record_failure(run_dir, exc))
                for spec, run_dir in pairs]


#: The executor each engine-specific flag belongs to.
_FLAG_ENGINES = {"--slurm-partition": "submitit", "--slurm-time": "submitit",
                 "--slurm-gpus-per-run": "submitit", "--slurm-setup": "submitit",
                 "--slurm-parameters": "submitit", "--ray-address": "ray",
                 "--gpus-per-run": "ray"}


def build_executor(kind: str = "local", *, workers: int | None = None,
                   slurm_partition: str | None = None, slurm_time: str | None = None,
                   slurm_gpus_per_run: int | None = None, slurm_setup: Sequence[str] = (),
                   slurm_parameters: str | Path | None = None, ray_address: str | None = None,
                   gpus_per_run: int | None = None) -> Executor:
    """The executor of ``crl study NAME --executor KIND`` and its flags (the same names).

    Args:
        kind: ``local``, ``submitit`` or ``ray``.
        workers: ``local``: parallel runs (default: the cores); ``submitit``: at most this many
            jobs of the array at once; ``ray``: the CPUs of the local Ray started for the study.
        slurm_partition: ``submitit``: the partition of the jobs.
        slurm_time: ``submitit``: each job's time limit (minutes or ``[days-]hh:mm:ss``).
        slurm_gpus_per_run: ``submitit``: GPUs of each job (with ``--device cuda``).
        slurm_setup: ``submitit``: shell lines run before each job.
        slurm_parameters: ``submitit``: a YAML file of more submitit parameters.
        ray_address: ``ray``: a running Ray cluster (default: start a local one).
        gpus_per_run: ``ray``: GPUs reserved by each run (with ``--device cuda``).

    Raises:
        CrlValueError: for an unknown kind, a flag of another executor, bad settings, or an
            engine that is not installed (the message names the extra that installs it).

    Example:
        >>> build_executor("local", workers=2).workers
        2
    """
    check_choice("crl study", "--executor", kind, EXECUTORS)
    given = {"--slurm-partition": slurm_partition, "--slurm-time": slurm_time,
             "--slurm-gpus-per-run": slurm_gpus_per_run, "--slurm-setup": list(slurm_setup),
             "--slurm-parameters": slurm_parameters, "--ray-address": ray_address,
             "--gpus-per-run": gpus_per_run}
    foreign = [flag for flag, value in given.items()
               if value not in (None, []) and _FLAG_ENGINES[flag] != kind]
    if foreign:
        raise CrlValueError(f"{', '.join(foreign)}: a setting of --executor "
                            f"{_FLAG_ENGINES[foreign[0]]}, not of --executor {kind}")
    if kind == "local":
        return LocalExecutor(workers)
    require_extra(kind)
    if kind == "submitit":
        from crl.experiments.executors_submitit import SubmititExecutor

        return SubmititExecutor(partition=slurm_partition, time_limit=slurm_time,
                                gpus_per_run=slurm_gpus_per_run or 0, setup=slurm_setup,
                                parameters=slurm_parameters, array_parallelism=workers)
    from crl.experiments.executors_ray import RayExecutor

    return RayExecutor(ray_address, num_cpus=workers, gpus_per_run=gpus_per_run or 0)
