"""Everything a run writes, in one object that writes only on rank 0.

:class:`RunWriter` owns the run directory (docs/training.md): ``config.json``, ``metrics.jsonl``,
``checkpoint.pt``, ``summary.json`` and the optional TensorBoard events. On every other rank of a
torchrun job each of its methods does nothing (as ``accelerate``'s ``on_main_process``), so the
training loop calls them unconditionally and holds no rank-0 branches of its own.

On rank 0, ``with RunWriter(...)`` holds the directory's write lock
(:func:`crl.rundir.lock_directory`, without waiting: a second writer fails at once, naming the
holder's pid), and every file goes through :class:`crl.rundir.OutputDir`: nothing is written
through a symbolic link or outside the run directory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from crl import distributed
from crl.rundir import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    OutputDir,
    lock_directory,
    read_jsonl,
    remove_temporaries,
)
from crl.train.checkpoint import save_checkpoint
from crl.train.progress import TensorBoardWriter

P = ParamSpec("P")
R = TypeVar("R")


def on_main(method: Callable[Concatenate[RunWriter, P], R]
            ) -> Callable[Concatenate[RunWriter, P], R | None]:
    """Run ``method`` on rank 0 only; elsewhere it returns None without doing anything."""

    @functools.wraps(method)
    def wrapper(self: RunWriter, *args: P.args, **kwargs: P.kwargs) -> R | None:
        return method(self, *args, **kwargs) if self.main else None

    return cast("Callable[Concatenate[RunWriter, P], R | None]", wrapper)


class RunWriter:
    """The run directory's writer (rank 0) or a writer that does nothing (other ranks).

    Args:
        run_dir: The run directory.
        main: True on the process that writes (default: :func:`crl.distributed.is_main`).
        tensorboard: Also write TensorBoard event files (needs ``tensorboard``).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp()) / "run"
        >>> with RunWriter(folder) as writer:
        ...     writer.start({"run_id": "x"}, resumed_at=None)
        ...     writer.record({"step": 1, "train/loss": 0.5})
        >>> sorted(p.name for p in folder.iterdir())
        ['config.json', 'metrics.jsonl']
        >>> RunWriter(folder, main=False).record({"step": 2})  # another rank: nothing
    """

    def __init__(self, run_dir: str | Path, *, main: bool | None = None,
                 tensorboard: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.main = distributed.is_main() if main is None else main
        self._tensorboard = tensorboard
        self._events: TensorBoardWriter | None = None
        self._files = OutputDir(self.run_dir)
        self._held = ExitStack()  # the directory's lock, while entered on rank 0

    @on_main
    def start(self, config_record: dict[str, Any], *, resumed_at: int | None) -> None:
        """Open the directory: fresh (an empty ``metrics.jsonl``), or resumed from the checkpoint
        of step ``resumed_at`` (temporary files of an interrupted write removed, records after
        the checkpoint and the final ones dropped); then write ``config.json``."""
        if resumed_at is None:
            self._files.mkdir()
            self._files.write_text(METRICS_FILE, "")
        else:
            remove_temporaries(self._files.file())  # left by a write the crash interrupted
            kept = [r for r in read_jsonl(self._files.file(METRICS_FILE))
                    if int(r.get("step", 0)) <= resumed_at and not r.get("final")]
            self._files.rewrite_jsonl(METRICS_FILE, kept)
        self._files.write_json(CONFIG_FILE, config_record)
        if self._tensorboard:
            self._files.file("tensorboard")  # not a link to elsewhere
            self._events = TensorBoardWriter(self.run_dir)

    @on_main
    def record(self, entry: dict[str, Any]) -> None:
        """Append a metrics record (and its scalars to TensorBoard)."""
        self._files.append_jsonl(METRICS_FILE, entry)
        if self._events is not None:
            self._events.scalars(entry, int(entry["step"]))

    def evaluation(self, compute: Callable[[], dict[str, float]], *, name: str, step: int,
                   epoch: float, final: bool = False) -> dict[str, float]:
        """Rank 0 computes the metrics of split ``name`` and records them; the other ranks go
        on and get ``{}``."""
        metrics = self.compute(compute)
        if metrics is None:
            return {}
        entry: dict[str, Any] = {"step": step, "epoch": epoch, "split": name, **metrics}
        if final:
            entry["final"] = True
        self.record(entry)
        return metrics

    @on_main
    def compute(self, fn: Callable[[], R]) -> R:
        """``fn()`` on rank 0 (work whose result only rank 0 needs); None elsewhere."""
        return fn()

    @on_main
    def checkpoint(self, state: Callable[[], dict[str, Any]]) -> None:
        """Write ``checkpoint.pt`` atomically from ``state()`` (built on rank 0 only)."""
        save_checkpoint(self._files.file(CHECKPOINT_FILE), state())

    @on_main
    def summary(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json``, the last file of a finished run."""
        self._files.write_json(SUMMARY_FILE, summary)

    def close(self) -> None:
        """Flush and close the TensorBoard events, if any."""
        if self._events is not None:
            self._events.close()
            self._events = None

    def __enter__(self) -> RunWriter:
        """Take the run directory's write lock (rank 0).

        Raises:
            CrlError: if another process holds it (naming its pid) or the directory is a
                symbolic link.
        """
        if self.main:
            self._held.enter_context(lock_directory(self.run_dir, blocking=False))
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            self.close()
        finally:
            self._held.close()


__all__ = ["RunWriter", "on_main"]
