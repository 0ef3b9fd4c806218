"""Grouped runs in a study: the runs of a grid that differ only in their negatives train together
(:func:`crl.train.fit_group`), each into its own run directory as if alone.

:func:`plan_tasks` turns a study's unfinished runs into tasks for the local executor: a
:class:`GroupTask` per set of two or more fresh runs with one :func:`~crl.train.group_key`
(for ``crl study negatives``: the runs of one ``(n, seed)``), a :class:`RunTask` for every other
run. Only studies whose ``execute`` is ``fit`` of the spec's config (``fit_runs = True``) are
grouped. A group runs its towers batched where that is exact (``fit_group(batched=True)``) and
each run's towers on their own otherwise (layer norms, dropout). A group that cannot train
together (hard negatives, a non-finite loss, a crash) falls back to one run at a time: each of
its runs resumes from what the group left in its directory (``group_error.txt`` says why), so a
study's results never depend on the grouping.
"""

from __future__ import annotations

import contextlib
import traceback
from collections import defaultdict
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

from crl.errors import CrlError
from crl.experiments.executors.base import (
    SPEC_FILE,
    RunOutcome,
    RunTask,
    Task,
    drop_weights,
    is_done,
    lock_run,
    run_task,
)
from crl.experiments.study import RunSpec, Study
from crl.rundir import CHECKPOINT_FILE, METRICS_FILE, OutputDir, write_json

#: Why a group fell back to one run at a time (in each of its run directories).
GROUP_ERROR_FILE = "group_error.txt"


@dataclass(frozen=True)
class GroupTask:
    """Runs of a study that train together (a :class:`~crl.experiments.executors.base.Task`,
    pickled to the worker as a :class:`~crl.experiments.executors.base.RunTask` is).

    Attributes:
        study: The study.
        specs: The runs (equal group keys).
        run_dirs: Their run directories.
        threads: Torch threads for the group (None: leave the process's setting).
        keep_weights: Keep the finished runs' ``checkpoint.pt`` (False: removed once each
            run's ``summary.json`` is written).
    """

    study: Study
    specs: tuple[RunSpec, ...]
    run_dirs: tuple[Path, ...]
    threads: int | None = None
    keep_weights: bool = False

    def with_threads(self, threads: int | None) -> Self:
        """The same group with ``threads`` torch threads."""
        return replace(self, threads=threads)

    def run(self) -> list[RunOutcome]:
        """Train the group (:func:`run_group`)."""
        return run_group(self)


def _fresh(run_dir: Path) -> bool:
    return not any((run_dir / name).exists() for name in (CHECKPOINT_FILE, METRICS_FILE))


def _split(groups: list[list[RunSpec]], others: int, workers: int) -> list[list[RunSpec]]:
    """Halve the largest groups while there are fewer tasks than workers (no idle worker)."""
    groups = sorted(groups, key=len, reverse=True)
    while len(groups) + others < workers and len(groups[0]) >= 2:
        big = groups.pop(0)
        half = (len(big) + 1) // 2
        groups = sorted([*groups, big[:half], big[half:]], key=len, reverse=True)
    return groups


def plan_tasks(study: Study, specs: Sequence[RunSpec], study_dir: Path, *,
               group_runs: bool = True, workers: int = 1,
               keep_weights: bool = False) -> list[Task]:
    """The tasks of ``specs`` (unfinished runs, one spec per run id): groups of fresh
    compatible runs and single runs (module docstring), groups halved while there are fewer
    tasks than ``workers``; ``group_runs=False``: single runs. ``keep_weights``: every task
    keeps its finished runs' weights."""
    from crl.train import group_key

    def alone(spec: RunSpec) -> RunTask:
        return RunTask(study, spec, study_dir / spec.run_id, keep_weights=keep_weights)

    if not group_runs or not getattr(study, "fit_runs", False):
        return [alone(s) for s in specs]
    groups: dict[str, list[RunSpec]] = defaultdict(list)
    tasks: list[Task] = []
    for spec in specs:
        key = group_key(spec.config) if _fresh(study_dir / spec.run_id) else None
        if key is None:
            tasks.append(alone(spec))
        else:
            groups[key].append(spec)
    for members in (_split(list(groups.values()), len(tasks), workers) if groups else []):
        if len(members) == 1:
            tasks.append(alone(members[0]))
        else:
            tasks.append(GroupTask(study, tuple(members),
                                   tuple(study_dir / s.run_id for s in members),
                                   keep_weights=keep_weights))
    return tasks


def _train_together(task: GroupTask) -> None:
    """Under every run's lock: train the fresh, unfinished runs of the group together."""
    from crl.train import GroupingError, fit_group, validate_config

    with ExitStack() as stack:
        for run_dir in sorted(task.run_dirs):  # one order everywhere: no deadlock
            run_dir.mkdir(parents=True, exist_ok=True)
            stack.enter_context(lock_run(run_dir))
        todo = [(s, d) for s, d in zip(task.specs, task.run_dirs, strict=True)
                if not is_done(d) and _fresh(d)]
        if len(todo) < 2:
            return  # others did them, or started them: they finish one at a time
        for spec, run_dir in todo:
            if not (run_dir / SPEC_FILE).exists():
                write_json(run_dir / SPEC_FILE, {"config": spec.config, "tags": spec.tags,
                                                 "label": spec.label})
        configs = [validate_config(s.config, origin=f"study {task.study.name} run {s.run_id}")
                   for s, _ in todo]
        dirs = [d for _, d in todo]
        try:  # one forward of the stacked towers where that is exact
            fit_group(configs, dirs, batched=True, final_checkpoint=task.keep_weights)
        except GroupingError:
            if not all(_fresh(d) for d in dirs):
                raise  # it failed after it began: the runs finish one at a time
            fit_group(configs, dirs, batched=False, final_checkpoint=task.keep_weights)
        for run_dir in dirs:  # every summary.json is on disk: fit_group returned
            if not task.keep_weights:
                drop_weights(run_dir)


def run_group(task: GroupTask) -> list[RunOutcome]:
    """The worker of a :class:`GroupTask`: the group trained together, then every run that is
    not finished (the group failed, or some of its runs were busy) one at a time, resuming.
    Returns one outcome per run."""
    import torch

    threads = torch.get_num_threads()
    if task.threads is not None:
        torch.set_num_threads(task.threads)
    trained: set[Path] = set()
    try:
        before = {d for d in task.run_dirs if is_done(d)}
        _train_together(task)
        trained = {d for d in task.run_dirs if is_done(d)} - before
    except Exception as exc:  # the runs are retried one at a time below
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        for run_dir in task.run_dirs:  # never through a symbolic link
            with contextlib.suppress(OSError, CrlError):
                OutputDir(run_dir).write_text(GROUP_ERROR_FILE, text)
    finally:
        torch.set_num_threads(threads)
    return [RunOutcome(spec.run_id, True) if run_dir in trained
            else run_task(RunTask(task.study, spec, run_dir, task.threads, task.keep_weights))
            for spec, run_dir in zip(task.specs, task.run_dirs, strict=True)]


__all__ = ["GROUP_ERROR_FILE", "GroupTask", "plan_tasks", "run_group"]
