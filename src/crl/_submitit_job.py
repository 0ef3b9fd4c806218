"""The job that ``crl study NAME --executor submitit`` submits for one task of a study.

It lives outside :mod:`crl.experiments` and imports neither torch nor the studies, because
submitit installs a job's time-limit signal handler only once the job's pickle is loaded: a
signal that arrives before (a preemption at any moment, a short time limit) would kill the job
instead of requeueing it. So the task (study, runs, run directories) travels as bytes and is
loaded, with torch and the study's modules, when the job starts running.
"""

from __future__ import annotations

from typing import Any

import cloudpickle
import submitit


class SubmititRun(submitit.helpers.Checkpointable):
    """One task's job: ``task.run()`` of the :class:`~crl.experiments.executors.base.Task` it
    carries (for a run, :func:`crl.experiments.executors.base.run_task`).

    At the time limit, ``Checkpointable.checkpoint`` resubmits the same job (each run's own
    ``checkpoint.pt`` is its state), and submitit requeues it.

    Args:
        payload: The task, cloudpickled.
    """

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def __call__(self) -> Any:
        return cloudpickle.loads(self.payload).run()
