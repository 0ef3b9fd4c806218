"""Tasks for :mod:`test_robustness_interrupt` that sleep instead of training, and the driver
that runs them on the local executor in a process of its own (so that a signal can be sent to
that process alone)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from crl.experiments.executors.base import RunOutcome


@dataclass(frozen=True)
class SleepTask:
    """A task of the local executor that records its start (``started-<index>``, holding the
    worker's pid), sleeps, then records its end (``done-<index>``)."""

    folder: Path
    index: int
    seconds: float
    threads: int | None = None

    @property
    def study(self) -> Any:
        return None

    @property
    def specs(self) -> tuple[Any, ...]:
        return ()

    @property
    def run_dirs(self) -> tuple[Path, ...]:
        return ()

    def with_threads(self, threads: int | None) -> SleepTask:
        return replace(self, threads=threads)

    def run(self) -> list[RunOutcome]:
        # written under another name and renamed: the test reads the pid as soon as the file
        # appears, so it must never see it empty
        temporary = self.folder / f".started-{self.index}.tmp"
        temporary.write_text(str(os.getpid()))
        os.replace(temporary, self.folder / f"started-{self.index}")
        time.sleep(self.seconds)
        (self.folder / f"done-{self.index}").write_text("")
        return [RunOutcome(f"task-{self.index}", True)]


def main(folder: Path, tasks: int, seconds: float) -> int:
    """Run ``tasks`` sleeping tasks on two workers; 130 when interrupted, as ``crl study``."""
    from crl.experiments.executors.local import LocalExecutor

    try:
        for outcome in LocalExecutor(2).run([SleepTask(folder, i, seconds)
                                             for i in range(tasks)], folder):
            print(outcome.run_id, flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
