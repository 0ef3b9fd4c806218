"""A request to stop training at the next checkpoint, for processes that train on someone
else's behalf (a study's local workers): the signal handler only sets a flag, and the
:class:`~crl.train.Trainer` ends the run right after its next checkpoint is on disk, so nothing
trained since the last checkpoint is lost and a re-run resumes from it (docs/errors.md,
"Interruptions")."""

from __future__ import annotations

import signal
import threading
from types import FrameType

_REQUESTED = threading.Event()


class StopRequested(KeyboardInterrupt):
    """Training stopped at a checkpoint because a stop was requested (an interrupt: not a
    failure of the run, which a re-run resumes)."""


def request_stop(signum: int | None = None, frame: FrameType | None = None) -> None:
    """Ask this process's training to stop after its next checkpoint (usable as a signal
    handler)."""
    _REQUESTED.set()


def stop_requested() -> bool:
    """Whether a stop was requested in this process (a run checkpointed by time then writes its
    checkpoint after the step under way, instead of at the end of its interval)."""
    return _REQUESTED.is_set()


def stop_on_signals() -> None:
    """From now on, SIGINT and SIGTERM to this process (the main thread's) request a stop
    instead of ending it at once."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)


def check_stop(step: int | None) -> None:
    """Raise :class:`StopRequested` when a stop was requested: called once a checkpoint of
    step ``step`` is written, or with None before a task starts."""
    if _REQUESTED.is_set():
        where = "before the task started" if step is None else \
            f"at the checkpoint of step {step}"
        raise StopRequested(f"stopped {where}, as requested")


__all__ = ["StopRequested", "check_stop", "request_stop", "stop_on_signals", "stop_requested"]
