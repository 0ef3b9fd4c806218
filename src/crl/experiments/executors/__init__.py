"""Where a study's runs execute: the engines (local process pool, submitit's Slurm job arrays,
Ray tasks), chosen by name with their own flags (:func:`build_executor`), the one worker they
all call on a run (:func:`run_task`, under the run's lock), and grouped runs for the local pool.
"""

from crl.experiments.executors.base import (
    EngineOptions,
    Executor,
    Flag,
    RunOutcome,
    RunTask,
    Task,
    check_gpus,
    execute_run,
    lock_run,
    run_task,
)
from crl.experiments.executors.local import LocalExecutor
from crl.experiments.executors.registry import (
    ENGINES,
    EXECUTORS,
    build_executor,
    engine_options,
    require_extra,
)

__all__ = [
    "ENGINES",
    "EXECUTORS",
    "EngineOptions",
    "Executor",
    "Flag",
    "LocalExecutor",
    "RunOutcome",
    "RunTask",
    "Task",
    "build_executor",
    "check_gpus",
    "engine_options",
    "execute_run",
    "lock_run",
    "require_extra",
    "run_task",
]
