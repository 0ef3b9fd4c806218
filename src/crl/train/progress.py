"""Progress display of a run: a rich progress bar (step, loss and its smoothed value,
samples/s, ETA) on a terminal, nothing otherwise; and optional TensorBoard event files."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from crl.errors import CrlError


class TrainProgress:
    """A progress bar over optimiser steps; silent when disabled or not on a terminal.

    Example:
        >>> with TrainProgress(total=10, start=0, batch_size=4, enabled=False) as bar:
        ...     bar.update(1, loss=0.5, smoothed=0.6)
        >>> bar.samples_per_second >= 0
        True
    """

    def __init__(self, total: int, start: int, batch_size: int, *, enabled: bool = True,
                 description: str = "train") -> None:
        self.total, self.start, self.batch_size = total, start, batch_size
        self.enabled = enabled and sys.stderr.isatty()
        self.description = description
        self._progress: Any = None
        self._task: Any = None
        self._t0 = time.perf_counter()
        self._steps = 0
        self.samples_per_second = 0.0

    def __enter__(self) -> TrainProgress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("ema {task.fields[ema]}"),
                TextColumn("{task.fields[rate]} samples/s"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=Console(stderr=True), transient=False)
            self._progress.__enter__()
            self._task = self._progress.add_task(self.description, total=self.total,
                                                 completed=self.start, loss="-", ema="-",
                                                 rate="-")
        return self

    def update(self, step: int, *, loss: float, smoothed: float | None = None) -> None:
        """Record that ``step`` (global) is done with training loss ``loss`` (the batch's) and
        ``smoothed`` (its moving average, ``train/loss_ema``; None: not shown)."""
        self._steps += 1
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        self.samples_per_second = self._steps * self.batch_size / elapsed
        if self._progress is not None:
            self._progress.update(self._task, completed=step, loss=f"{loss:.4f}",
                                  ema="-" if smoothed is None else f"{smoothed:.4f}",
                                  rate=f"{self.samples_per_second:,.0f}")

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.__exit__(kind, error, trace)


class TensorBoardWriter:
    """Scalars to TensorBoard event files in ``<run_dir>/tensorboard`` (needs tensorboard)."""

    def __init__(self, run_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise CrlError(
                "--tensorboard needs the tensorboard package, which is not installed; install it "
                "with `pip install crl[tensorboard]` (or `pip install tensorboard`)"
            ) from None
        self._writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def scalars(self, record: dict[str, Any], step: int) -> None:
        """Write the numeric entries of a metrics record."""
        prefix = f"{record['split']}/" if "split" in record else ""
        for key, value in record.items():
            if key not in ("step", "epoch") and isinstance(value, (int, float)):
                self._writer.add_scalar(prefix + key, float(value), step)

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


__all__ = ["TensorBoardWriter", "TrainProgress"]
