"""The job that ``crl study NAME --executor submitit`` submits for one run.

It lives outside :mod:`crl.experiments` and imports neither torch nor the studies, because
submitit installs a job's time-limit signal handler only once the job's pickle is loaded: a
signal that arrives before (a preemption at any moment, a short time limit) would kill the job
instead of requeueing it. So the run's task (study, spec, run directory) travels as bytes and
is loaded, with torch and the study's modules, when the job starts running.
"""

from __future__ import annotations

from typing import Any

import cloudpickle
import submitit


class SubmititRun(submitit.helpers.Checkpointable):
    """One run's job: :func:`crl.experiments.executors.base.run_task` on the task it carries.

    At the time limit, ``Checkpointable.checkpoint`` resubmits the same job (the run's own
    ``checkpoint.pt`` is its state), and submitit requeues it.

    Args:
        payload: The :class:`~crl.experiments.executors.base.RunTask`, cloudpickled.
    """

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def __call__(self) -> Any:
        from crl.experiments.executors.base import run_task

        return run_task(cloudpickle.loads(self.payload))
