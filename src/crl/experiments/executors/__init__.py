"""Where a study's runs execute: the engines (local process pool, submitit's Slurm job arrays,
Ray tasks), chosen by name with their own flags (:func:`build_executor`), the one worker they
all call on a run (:func:`run_task`, under the run's lock), and grouped runs for the local pool.
"""

from crl.experiments.executors.base import (
    Executor,
    RunOutcome,
    RunTask,
    check_gpus,
    execute_run,
    require_extra,
    run_task,
)
from crl.experiments.executors.local import LocalExecutor
from crl.experiments.executors.registry import EXECUTORS, build_executor

__all__ = [
    "EXECUTORS",
    "Executor",
    "LocalExecutor",
    "RunOutcome",
    "RunTask",
    "build_executor",
    "check_gpus",
    "execute_run",
    "require_extra",
    "run_task",
]
