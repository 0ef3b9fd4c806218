"""Run a study's grid on local processes: parallel, resumable, never a run twice.

The state of a study is its directory only. A run whose ``summary.json`` exists is done and is
never redone; a run with a checkpoint resumes from it; a run being executed holds an exclusive
``flock`` on ``<run>/.lock``, so a re-run of a study whose earlier attempt is still alive (an
orphaned worker after ``kill -9`` of the parent) waits for that run instead of doing it twice.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from crl.data.cache import prepare_data_caches
from crl.errors import CrlError, CrlValueError
from crl.experiments.study import RunSpec, Study
from crl.rundir import CHECKPOINT_FILE, METRICS_FILE, SUMMARY_FILE, write_json

STUDY_FILE = "study.json"
SPEC_FILE = "spec.json"
ERROR_FILE = "error.txt"


@dataclass
class StudyOutcome:
    """What :func:`run_study` did."""

    study_dir: Path
    total: int
    skipped: int
    completed: int
    failed: list[tuple[str, str]] = field(default_factory=list)


def default_workers() -> int:
    """The number of cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def prepare_study_dir(study: Study, out_dir: Path) -> Path:
    """Create ``out_dir/<study>`` (with a clear error when it cannot be written) and record
    the study's name, preset and options in ``study.json``."""
    study_dir = Path(out_dir) / study.name
    try:
        study_dir.mkdir(parents=True, exist_ok=True)
        probe = study_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CrlValueError(
            f"cannot write the study directory {study_dir}: {exc.strerror or exc}; "
            "choose another one with --out DIR"
        ) from None
    write_json(study_dir / STUDY_FILE, study.describe())
    return study_dir


def _is_done(run_dir: Path) -> bool:
    return (run_dir / SUMMARY_FILE).exists()


def execute_run(study: Study, spec: RunSpec, run_dir: Path) -> bool:
    """Run one grid point under its lock; returns False when it was already done."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits for another live attempt at this run
        try:
            if _is_done(run_dir):
                return False
            if not (run_dir / SPEC_FILE).exists():
                write_json(run_dir / SPEC_FILE, {"config": spec.config, "tags": spec.tags,
                                                 "label": spec.label})
            # An attempt killed before its first checkpoint leaves metrics.jsonl: resuming
            # then starts the run over (fit refuses a non-empty directory without resume).
            resume = (run_dir / CHECKPOINT_FILE).exists() or (run_dir / METRICS_FILE).exists()
            study.execute(spec, run_dir, resume=resume)
            if not _is_done(run_dir):
                raise RuntimeError(f"study {study.name}: run {spec.run_id} ended without "
                                   f"writing {SUMMARY_FILE}")
            (run_dir / ERROR_FILE).unlink(missing_ok=True)
            return True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _worker(study_name: str, preset: str, options: dict[str, Any], spec: RunSpec,
            run_dir: str, threads: int) -> bool:
    """Entry point of a pool process: rebuild the study by name and run one grid point."""
    import torch

    from crl.experiments.registry import get_study

    torch.set_num_threads(threads)
    study = get_study(study_name, preset=preset, **options)
    return execute_run(study, spec, Path(run_dir))


def _record_failure(run_dir: Path, exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        (run_dir / ERROR_FILE).write_text(text, encoding="utf-8")
    except OSError:
        pass
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def run_study(study: Study, out_dir: str | Path, *, workers: int | None = None,
              progress: bool = True) -> StudyOutcome:
    """Run every unfinished run of ``study`` into ``out_dir/<study.name>/<run_id>/``.

    Args:
        study: The study.
        out_dir: The parent of the study directory.
        workers: Parallel processes (default: the number of cores). 1 runs in this process.
        progress: Show one overall progress bar.

    Returns:
        A :class:`StudyOutcome`; failed runs are listed there (their traceback is in
        ``<run>/error.txt``) and do not stop the others.
    """
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise CrlValueError(f"study {study.name}: `workers` must be >= 1; got {workers}")
    study_dir = prepare_study_dir(study, Path(out_dir))
    # Specs may share a run (equal configs, different tags): each run id is executed once.
    unique = list({s.run_id: s for s in study.runs()}.values())
    pending = [s for s in unique if not _is_done(study_dir / s.run_id)]
    outcome = StudyOutcome(study_dir, total=len(unique), skipped=len(unique) - len(pending),
                           completed=0)
    # A missing data cache (mined pycode pairs) is filled once here, not by every worker.
    prepare_data_caches([s.config["data"] for s in pending
                         if isinstance(s.config.get("data"), dict)], progress=progress)
    columns = (TextColumn(f"[bold]study {study.name}[/] ({study.preset})"), BarColumn(),
               MofNCompleteColumn(), TextColumn("runs"), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, disable=not progress, transient=False) as bar:
        task = bar.add_task("runs", total=len(unique), completed=outcome.skipped)
        if workers == 1 or len(pending) <= 1:
            for spec in pending:
                try:
                    execute_run(study, spec, study_dir / spec.run_id)
                    outcome.completed += 1
                except CrlError:
                    raise
                except Exception as exc:  # one bad run must not lose the others
                    message = _record_failure(study_dir / spec.run_id, exc)
                    outcome.failed.append((spec.run_id, message))
                bar.advance(task)
            return outcome
        threads = max(1, default_workers() // workers)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures: dict[Future[bool], RunSpec] = {
                pool.submit(_worker, study.name, study.preset, dict(study.options), spec,
                            str(study_dir / spec.run_id), threads): spec
                for spec in pending
            }
            remaining = set(futures)
            try:
                while remaining:
                    done, remaining = wait(remaining, timeout=1.0, return_when=FIRST_COMPLETED)
                    for future in done:
                        spec = futures[future]
                        try:
                            future.result()
                            outcome.completed += 1
                        except Exception as exc:
                            message = _record_failure(study_dir / spec.run_id, exc)
                            outcome.failed.append((spec.run_id, message))
                        bar.advance(task)
            except KeyboardInterrupt:
                for future in remaining:
                    future.cancel()
                raise
    return outcome
