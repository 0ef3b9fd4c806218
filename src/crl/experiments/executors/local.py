"""``--executor local``: a study's tasks in a process pool on this machine (the default).

An interrupt stops the work: SIGINT (Ctrl-C) or SIGTERM to the main process, even to it alone,
cancels the tasks not yet started and asks the running workers to stop at their runs' next
checkpoint (:mod:`crl.train.stop`; a worker still running :data:`STOP_GRACE_S` seconds later is
ended at once), then propagates as ``KeyboardInterrupt`` (``crl study`` exits with code 130). A
stopped run keeps its last checkpoint (every file is written atomically, and its lock dies with
its worker), so a re-run resumes it and ends as an uninterrupted study would.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
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

#: Seconds an interrupted study waits for its workers to reach a checkpoint before ending them.
STOP_GRACE_S = 15.0


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
        with _sigterm_interrupts():
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
                        done, remaining = wait(remaining, timeout=1.0,
                                               return_when=FIRST_COMPLETED)
                        for future in done:
                            yield from _outcomes(future, futures[future])
                except BaseException:  # Ctrl-C, SIGTERM, or the caller stopped listening
                    _stop(pool)
                    raise


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM interrupts like Ctrl-C while the tasks run (in the main thread, where Python
    handles signals), instead of ending this process and leaving its workers running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel the tasks not yet started and stop the running workers at their next checkpoint
    (a worker gets no signal of its own when only this process was interrupted, and would
    finish its task, then the queued ones, before the pool's shutdown returned): SIGTERM asks
    (:func:`_run` made it a stop request), SIGKILL ends a worker still alive after
    :data:`STOP_GRACE_S` seconds (a task between checkpoints for longer, or not training)."""
    workers = list((pool._processes or {}).values())  # terminate_workers() from Python 3.14
    pool.shutdown(wait=False, cancel_futures=True)  # forgets the processes
    for process in workers:
        process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for process in workers:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in workers:
        if process.is_alive():
            process.kill()


def _run(task: Task) -> list[RunOutcome]:
    """The body of a pool worker (a module-level function, so the pool pickles it by name):
    an interrupt of the worker requests a stop at the next checkpoint (:mod:`crl.train.stop`),
    and a task the worker takes after one does not start."""
    from crl.train.stop import check_stop, stop_on_signals  # the worker trains: torch is due

    stop_on_signals()
    check_stop(None)
    return task.run()


def _outcomes(future: Future[list[RunOutcome]], task: Task) -> list[RunOutcome]:
    try:
        return future.result()
    except Exception as exc:  # the worker process died (BrokenProcessPool)
        return lost_outcomes(task, exc, first_line(exc))
