"""``--executor local``: a study's tasks in a process pool on this machine (the default)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Self

from crl.errors import CrlValueError
from crl.experiments.executors.base import (
    EngineOptions,
    Executor,
    RunOutcome,
    Task,
    default_workers,
    first_line,
    lost_outcomes,
)


class LocalExecutor(Executor):
    """A process pool on this machine: ``workers`` tasks at once, each with ``cores // workers``
    torch threads (``workers=1``: one task after the other in this process).

    Args:
        workers: ``--workers``: parallel tasks (default: the cores this process may use).

    Raises:
        CrlValueError: when ``workers`` is not an integer >= 1.
    """

    kind = "local"
    summary = "a process pool, the default"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = default_workers() if workers is None else workers
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise CrlValueError(f"--workers must be an integer >= 1; got {workers!r}")

    @classmethod
    def from_options(cls, workers: int | None, options: EngineOptions) -> Self:
        """``--executor local --workers N`` (the local pool has no flags of its own)."""
        return cls(workers)

    def run(self, tasks: Sequence[Task], study_dir: Path) -> Iterator[RunOutcome]:
        if self.workers == 1 or len(tasks) <= 1:
            for task in tasks:
                yield from task.run()
            return
        threads = max(1, default_workers() // self.workers)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=self.workers, mp_context=context) as pool:
            futures: dict[Future[list[RunOutcome]], Task] = {
                pool.submit(_run, task.with_threads(threads)): task for task in tasks}
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


def _run(task: Task) -> list[RunOutcome]:
    """The body of a pool worker (a module-level function, so the pool pickles it by name)."""
    return task.run()


def _outcomes(future: Future[list[RunOutcome]], task: Task) -> list[RunOutcome]:
    try:
        return future.result()
    except Exception as exc:  # the worker process died (BrokenProcessPool)
        return lost_outcomes(task, exc, first_line(exc))
