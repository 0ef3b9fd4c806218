"""``--executor ray``: a study's runs as Ray tasks, on a local Ray or a Ray cluster.

Each task of the study (a run) is one Ray task that calls ``task.run()`` (for a run, the shared
worker :func:`crl.experiments.executors.base.run_task`) with ``cpus_per_run`` CPUs (its torch
threads) and ``gpus_per_run`` GPUs (Ray sets ``CUDA_VISIBLE_DEVICES`` for the task, so
``--device cuda`` trains on the GPU it was given). Without an address, a local Ray is started
for the study with ``num_cpus`` CPUs and shut down at the end. A task whose worker or node dies
is retried by Ray and resumes from the run's last checkpoint; the run directories must lie on a
file system every node sees (docs/distributed.md).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Self

from crl.errors import CrlValueError
from crl.experiments.executors.base import (
    EngineOptions,
    Executor,
    Flag,
    RunOutcome,
    Task,
    check_gpus,
    default_workers,
    lost_outcomes,
)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class RayOptions(EngineOptions):
    """The flags of ``--executor ray``."""

    ray_address: Annotated[str | None, Flag(
        "ray: a running Ray cluster (default: a local Ray started for the study with --workers "
        "CPUs).")] = None
    gpus_per_run: Annotated[int | None, Flag(
        "ray: GPUs reserved by each run (with --device cuda).")] = None


def _remote_run(task: Task) -> list[RunOutcome]:
    """The body of a Ray task (a module-level function, so Ray pickles it by reference)."""
    return task.run()


class RayExecutor(Executor):
    """Ray tasks, one per run.

    Args:
        address: ``--ray-address`` of a running Ray cluster (``auto``, ``ray://head:10001``,
            ``head:6379``); None starts a local Ray for the study.
        num_cpus: CPUs of the local Ray (``--workers``; default: this machine's cores); with an
            address the cluster's own resources count.
        cpus_per_run: CPUs reserved by each run (its torch threads).
        gpus_per_run: ``--gpus-per-run``: GPUs reserved by each run (for ``--device cuda``).

    Raises:
        CrlValueError: for bad settings.
    """

    kind = "ray"
    summary = "Ray tasks"
    Options = RayOptions
    requires = ("ray", "ray")

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None,
                 cpus_per_run: int = 1, gpus_per_run: int = 0) -> None:
        if address is not None and num_cpus is not None:
            raise CrlValueError("--workers sets the CPUs of the local Ray started for the study; "
                                f"with --ray-address {address} the cluster's resources count: "
                                "drop --workers")
        for name, value, low in (("num_cpus (--workers)", num_cpus, 1),
                                 ("cpus_per_run", cpus_per_run, 1),
                                 ("--gpus-per-run", gpus_per_run, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < low):
                raise CrlValueError(f"ray: {name} must be an integer >= {low}; got {value!r}")
        self.address = address
        self.num_cpus = num_cpus
        self.cpus_per_run = cpus_per_run
        self.gpus_per_run = gpus_per_run

    @classmethod
    def from_options(cls, workers: int | None, options: RayOptions) -> Self:
        """``--executor ray`` with ``--workers`` (the CPUs of a local Ray) and its flags."""
        return cls(options.ray_address, num_cpus=workers, gpus_per_run=options.gpus_per_run or 0)

    def _start(self, ray: Any) -> bool:
        """Connect to Ray (or start a local one); True when this call started it."""
        if ray.is_initialized():  # a Ray the caller started: use it, leave it running
            return False
        options: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
        if self.address is not None:
            try:
                ray.init(address=self.address, **options)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise CrlValueError(f"--ray-address {self.address}: cannot connect "
                                    f"({str(exc).splitlines()[0]})") from None
        else:
            ray.init(num_cpus=self.num_cpus or default_workers(), include_dashboard=False,
                     **options)
        return True

    def run(self, tasks: Sequence[Task], study_dir: Path) -> Iterator[RunOutcome]:
        check_gpus("--gpus-per-run", self.gpus_per_run, tasks)
        if not tasks:
            return
        ray = self.import_engine()
        started = self._start(ray)
        try:
            remote = ray.remote(_remote_run).options(num_cpus=self.cpus_per_run,
                                                     num_gpus=self.gpus_per_run)
            refs = {remote.remote(t.with_threads(self.cpus_per_run)): t for t in tasks}
            pending = list(refs)
            try:
                while pending:
                    done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
                    for ref in done:
                        yield from _task_outcomes(ray, ref, refs[ref])
            except BaseException:  # Ctrl-C, or the caller stopped listening
                for ref in pending:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref, force=True)
                raise
        finally:
            if started:
                ray.shutdown()


def _task_outcomes(ray: Any, ref: Any, task: Task) -> list[RunOutcome]:
    try:
        outcomes: list[RunOutcome] = ray.get(ref)
    except Exception as exc:  # the task itself failed: worker killed, out of retries
        # A task error wraps its cause in a coloured header line: report the cause.
        cause = getattr(exc, "cause", None) or exc
        lines = [ln for ln in _ANSI.sub("", str(cause)).splitlines() if ln.strip()]
        return lost_outcomes(task, exc, "ray task: " + (lines[0].strip() if lines
                                                         else type(cause).__name__))
    return outcomes
