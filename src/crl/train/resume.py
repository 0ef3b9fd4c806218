"""What a run directory holds when a run starts: nothing, a checkpoint to resume from, or a
finished run (:func:`open_run`); and what a finished or stopped run returns
(:class:`RunResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl.errors import CrlError, StaleRunError
from crl.rundir import CHECKPOINT_FILE, METRICS_FILE, SUMMARY_FILE, read_json
from crl.train.checkpoint import load_checkpoint


@dataclass(frozen=True)
class RunResult:
    """What :func:`crl.train.fit` returns (one per run for :func:`crl.train.fit_group`).

    Attributes:
        run_dir: The run directory.
        summary: The final metrics (the content of ``summary.json``); empty when the run stopped
            early at ``stop_at``.
        step: The last completed optimiser step.
        finished: True when the whole budget ran and ``summary.json`` was written.
    """

    run_dir: Path
    summary: dict[str, Any]
    step: int
    finished: bool


def open_run(run_dir: Path, run_id: str,
             resume: bool) -> tuple[RunResult | None, dict[str, Any] | None]:
    """The finished run to return as is, or the checkpoint to resume from (or None).

    Raises:
        CrlError: for a run directory that holds a run, without ``resume``.
        StaleRunError: for a finished run or checkpoint of another config or crl version.
    """
    if resume and (run_dir / SUMMARY_FILE).exists():
        done = read_json(run_dir / SUMMARY_FILE)
        if done.get("run_id") != run_id:
            raise StaleRunError(f"resume: {run_dir} holds the finished run "
                                f"{done.get('run_id')}, not this config ({run_id}); choose "
                                "another --out")
        return RunResult(run_dir, done, int(done["step"]), True), None
    if resume:
        path = run_dir / CHECKPOINT_FILE
        return None, (load_checkpoint(path, config_hash=run_id) if path.exists() else None)
    busy = [name for name in (METRICS_FILE, CHECKPOINT_FILE, SUMMARY_FILE)
            if (run_dir / name).exists()]
    if busy:
        raise CrlError(
            f"run directory {run_dir} already holds {', '.join(busy)}; pass --resume "
            "(resume=True) to continue or finish it, or choose another --out"
        )
    return None, None


__all__ = ["RunResult", "open_run"]
