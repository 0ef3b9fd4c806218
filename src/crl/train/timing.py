"""Time in training: a run's own time (the wall-clock and CPU seconds of its training and
evaluation, and a group's time split among the runs that shared it: the ``time/*`` entries of
``summary.json``, docs/training.md, "The run directory"), and when a checkpoint is due.

A lone run's time is the time from the start of its training to its summary. Runs trained
together (:func:`crl.train.fit_group`) share one loop: each run's own work (its evaluations and
checkpoint writes) is measured exactly, and what is left of the group's time (the shared batches,
forward, backward and optimiser steps) is split evenly, so the runs' times add up to the
group's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from crl.train.stop import stop_requested


@dataclass
class Spent:
    """Wall-clock (``time.perf_counter``) and CPU seconds (``time.process_time``: every thread
    of this process, user and system) spent so far.

    Example:
        >>> spent = Spent()
        >>> with spent.measure():
        ...     _ = sum(range(1000))
        >>> spent.wall_s >= 0 and spent.cpu_s >= 0
        True
    """

    wall_s: float = 0.0
    cpu_s: float = 0.0

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Add the time of the block."""
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall_s += time.perf_counter() - wall
            self.cpu_s += time.process_time() - cpu


class Stopwatch:
    """Seconds since it was made, wall-clock and CPU."""

    def __init__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def elapsed(self) -> Spent:
        """The time since the stopwatch was made."""
        return Spent(time.perf_counter() - self._wall, time.process_time() - self._cpu)


def time_fields(total: Spent, own: Sequence[Spent]) -> list[dict[str, float]]:
    """Each run's ``time/*`` summary entries, from the time of the whole loop (``total``) and
    each run's own work in it (``own``, one per run).

    One run: ``time/train_eval_s`` and ``time/cpu_s`` are ``total``. Several (a group of ``G``):
    a run's ``time/train_eval_s`` is its own wall time plus ``1/G`` of the group's time that is
    no run's own, ``time/cpu_s`` likewise; ``time/group_s`` is the group's wall time and
    ``time/group_size`` is ``G``.

    Example:
        >>> rows = time_fields(Spent(10.0, 8.0), [Spent(1.0, 1.0), Spent(3.0, 1.0)])
        >>> [r["time/train_eval_s"] for r in rows], [r["time/cpu_s"] for r in rows]
        ([4.0, 6.0], [4.0, 4.0])
        >>> rows[0]["time/group_s"], rows[0]["time/group_size"]
        (10.0, 2)
    """
    if len(own) == 1:
        return [{"time/train_eval_s": total.wall_s, "time/cpu_s": total.cpu_s}]
    size = len(own)
    shared_wall = max(0.0, total.wall_s - sum(s.wall_s for s in own)) / size
    shared_cpu = max(0.0, total.cpu_s - sum(s.cpu_s for s in own)) / size
    return [{"time/train_eval_s": s.wall_s + shared_wall, "time/cpu_s": s.cpu_s + shared_cpu,
             "time/group_s": total.wall_s, "time/group_size": size} for s in own]


class CheckpointClock:
    """When a checkpoint is due: every ``every`` steps, and every ``every_s`` seconds
    (``time.monotonic``) since the last one or the start (:meth:`restart`), at once when a stop
    was requested (:mod:`crl.train.stop`); None: not by steps, not by time.

    Example:
        >>> clock = CheckpointClock(every=4, every_s=None)
        >>> [step for step in range(1, 10) if clock.due(step)]
        [4, 8]
        >>> CheckpointClock(every=None, every_s=1e-9).due(1)
        True
    """

    def __init__(self, every: int | None, every_s: float | None) -> None:
        self.every, self.every_s = every, every_s
        self.restart()

    def restart(self) -> None:
        """Count the seconds from now (training starts, or a checkpoint was written)."""
        self._last = time.monotonic()

    def due(self, step: int) -> bool:
        """Whether a checkpoint is due after step ``step``."""
        if self.every and step % self.every == 0:
            return True
        return self.every_s is not None and (
            stop_requested() or time.monotonic() - self._last >= self.every_s)


__all__ = ["CheckpointClock", "Spent", "Stopwatch", "time_fields"]
