"""``--executor local``: a study's runs in a process pool on this machine (the default)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any

from crl.errors import CrlValueError
from crl.experiments.executors.base import (
    Executor,
    RunOutcome,
    RunTask,
    default_workers,
    record_failure,
    run_task,
)


class LocalExecutor(Executor):
    """A process pool on this machine: ``workers`` runs at once, each with ``cores // workers``
    torch threads (``workers=1``: one run after the other in this process)."""

    kind = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = default_workers() if workers is None else workers
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise CrlValueError(f"--workers must be an integer >= 1; got {workers!r}")

    def run(self, tasks: Sequence[RunTask], study_dir: Path) -> Iterator[RunOutcome]:
        """Also takes groups of runs (:class:`crl.experiments.executors.grouping.GroupTask`)."""
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
    with ``run()``: :class:`crl.experiments.executors.grouping.GroupTask`)."""
    return [run_task(task)] if isinstance(task, RunTask) else list(task.run())


def _outcomes(future: Future[list[RunOutcome]], task: Any) -> list[RunOutcome]:
    try:
        return future.result()
    except Exception as exc:  # the worker process died (BrokenProcessPool)
        pairs = ([(task.spec, task.run_dir)] if isinstance(task, RunTask)
                 else list(zip(task.specs, task.run_dirs, strict=True)))
        return [RunOutcome(spec.run_id, False, record_failure(run_dir, exc))
                for spec, run_dir in pairs]
