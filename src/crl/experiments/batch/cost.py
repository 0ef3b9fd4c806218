"""What one batch size costs here: the training loop's peak memory growth and its time per step,
measured in the run itself (docs/batch.md, "Memory and time").

:func:`metered_fit` is :func:`crl.train.fit` for one study run, with the loop metered: the
peak resident set size (Linux's ``VmHWM``, reset through ``/proc/self/clear_refs`` when the loop
starts, after the data and the model are built) minus the resident size at that moment, on CUDA
the peak of allocated memory above the allocation at the start, and the loop's wall-clock time
over the steps it took (data loading, forward, backward, optimiser and checkpoints; not the
final evaluation, which is the same for every B).
"""

from __future__ import annotations

import ctypes
import math
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from crl import distributed
from crl.errors import CrlValueError, StaleRunError
from crl.rundir import CHECKPOINT_FILE, CONFIG_FILE, METRICS_FILE, SUMMARY_FILE
from crl.train import RunResult, Step, Trainer, TrainingRun, build_step, config_hash
from crl.train.config import TrainConfig
from crl.train.trainer import open_run
from crl.train.writer import RunWriter

MIB = 2.0 ** 20
#: The summary keys the cost adds to a run's ``summary.json``.
COST_KEYS = ("cost/peak_rss_growth_mib", "cost/peak_cuda_mib", "cost/step_s", "cost/loop_s",
             "cost/steps_timed")


def _status_kib(field: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (None where there is no such file)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> str:
    """Reset the peak resident size; returns how the peak will be read (``VmHWM`` after a
    reset, else ``ru_maxrss``: the process's lifetime peak, a lower bound on the growth)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # return freed heap of an earlier run first
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return "VmHWM"
    except OSError:
        return "ru_maxrss"


@dataclass
class Meter:
    """A running measurement of the loop (:meth:`start`, then :meth:`stop`)."""

    method: str
    rss_kib: float
    peak_kib: float
    cuda: torch.device | None
    cuda_start: int
    clock: float

    @classmethod
    def start(cls, device: torch.device) -> Meter:
        """Reset the peaks and take the starting levels."""
        method = _reset_peak()
        rss = _status_kib("VmRSS") or 0
        peak = rss if method == "VmHWM" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        cuda = device if device.type == "cuda" else None
        start = 0
        if cuda is not None:
            torch.cuda.synchronize(cuda)
            torch.cuda.reset_peak_memory_stats(cuda)
            start = torch.cuda.memory_allocated(cuda)
        return cls(method, float(rss), float(peak), cuda, start, time.perf_counter())

    def stop(self, steps: int) -> dict[str, Any]:
        """The cost of the ``steps`` taken since :meth:`start` (the :data:`COST_KEYS`)."""
        if self.cuda is not None:
            torch.cuda.synchronize(self.cuda)
        seconds = time.perf_counter() - self.clock
        if self.method == "VmHWM":
            growth = (_status_kib("VmHWM") or self.rss_kib) - self.rss_kib
        else:
            growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.peak_kib
        cuda = (math.nan if self.cuda is None else
                (torch.cuda.max_memory_allocated(self.cuda) - self.cuda_start) / MIB)
        return {"cost/peak_rss_growth_mib": max(0.0, growth) * 1024 / MIB,
                "cost/peak_cuda_mib": cuda, "cost/loop_s": seconds,
                "cost/steps_timed": steps,
                "cost/step_s": seconds / steps if steps > 0 else math.nan,
                "cost/rss_method": self.method}


class _MeteredTrainer(Trainer):
    """A :class:`~crl.train.Trainer` of one run whose loop is metered (the final evaluation
    is not)."""

    def __init__(self, runs: Sequence[TrainingRun], step: Step) -> None:
        super().__init__(runs, step)
        self.cost: dict[str, Any] = {}
        self._meter: Meter | None = None
        self._first = 0

    def train(self, stop_at: int | None = None, *, progress: bool = False) -> list[RunResult]:
        self._first = self.runs[0].step
        self._meter = Meter.start(self.runs[0].device)
        return super().train(stop_at, progress=progress)

    def finish(self, clock: Any) -> list[RunResult]:
        if self._meter is not None:
            self.cost = self._meter.stop(self.runs[0].step - self._first)
        return super().finish(clock)


def _fit(config: TrainConfig, run_dir: Path, resume: bool) -> tuple[RunResult, dict[str, Any]]:
    done, checkpoint = open_run(run_dir, config_hash(config), resume)
    if done is not None:
        return done, {}
    device = distributed.device_for(config.train.device)
    threads = torch.get_num_threads()
    if config.train.num_threads is not None:
        torch.set_num_threads(config.train.num_threads)
    try:
        with RunWriter(run_dir) as writer:
            run = TrainingRun.start(config, writer, device, checkpoint=checkpoint)
            trainer = _MeteredTrainer([run], build_step(config.train.micro_batch_size,
                                                        config.train.precision))
            [result] = trainer.train()
            return result, trainer.cost
    finally:
        torch.set_num_threads(threads)


def metered_fit(config: TrainConfig, run_dir: Path, *, resume: bool
                ) -> tuple[RunResult, dict[str, Any]]:
    """Train one study run into ``run_dir`` (as :func:`crl.experiments.runs.fit_study_run`:
    work of another resolved config or crl version there starts over) and return its result
    with the loop's cost (the :data:`COST_KEYS`; empty when the run had finished before, and
    only the resumed part's when it resumed).

    Raises:
        CrlValueError: for a CUDA device on a machine without one.
        CrlError: as :func:`crl.train.fit`.
    """
    if config.train.device.startswith("cuda") and not torch.cuda.is_available():
        raise CrlValueError(f"train.device is {config.train.device!r} but CUDA is not available "
                            "on this machine; use --device cpu")
    try:
        return _fit(config, run_dir, resume)
    except StaleRunError:
        for name in (SUMMARY_FILE, CHECKPOINT_FILE, METRICS_FILE, CONFIG_FILE):
            (run_dir / name).unlink(missing_ok=True)
        return _fit(config, run_dir, False)
