"""Executors by name (``crl study NAME --executor KIND``) and the flags of each."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from crl._validation import check_choice
from crl.errors import CrlValueError
from crl.experiments.executors.base import Executor, require_extra
from crl.experiments.executors.local import LocalExecutor

#: The executors by name (``crl study NAME --executor KIND``).
EXECUTORS: tuple[str, ...] = ("local", "submitit", "ray")
#: The executor each engine-specific flag belongs to.
_FLAG_ENGINES = {"--slurm-partition": "submitit", "--slurm-time": "submitit",
                 "--slurm-gpus-per-run": "submitit", "--slurm-setup": "submitit",
                 "--slurm-parameters": "submitit", "--ray-address": "ray",
                 "--gpus-per-run": "ray"}


def build_executor(kind: str = "local", *, workers: int | None = None,
                   slurm_partition: str | None = None, slurm_time: str | None = None,
                   slurm_gpus_per_run: int | None = None, slurm_setup: Sequence[str] = (),
                   slurm_parameters: str | Path | None = None, ray_address: str | None = None,
                   gpus_per_run: int | None = None) -> Executor:
    """The executor of ``crl study NAME --executor KIND`` and its flags (the same names).

    Args:
        kind: ``local``, ``submitit`` or ``ray``.
        workers: ``local``: parallel runs (default: the cores); ``submitit``: at most this many
            jobs of the array at once; ``ray``: the CPUs of the local Ray started for the study.
        slurm_partition: ``submitit``: the partition of the jobs.
        slurm_time: ``submitit``: each job's time limit (minutes or ``[days-]hh:mm:ss``).
        slurm_gpus_per_run: ``submitit``: GPUs of each job (with ``--device cuda``).
        slurm_setup: ``submitit``: shell lines run before each job.
        slurm_parameters: ``submitit``: a YAML file of more submitit parameters.
        ray_address: ``ray``: a running Ray cluster (default: start a local one).
        gpus_per_run: ``ray``: GPUs reserved by each run (with ``--device cuda``).

    Raises:
        CrlValueError: for an unknown kind, a flag of another executor, bad settings, or an
            engine that is not installed (the message names the extra that installs it).

    Example:
        >>> build_executor("local", workers=2).workers
        2
    """
    check_choice("crl study", "--executor", kind, EXECUTORS)
    given = {"--slurm-partition": slurm_partition, "--slurm-time": slurm_time,
             "--slurm-gpus-per-run": slurm_gpus_per_run, "--slurm-setup": list(slurm_setup),
             "--slurm-parameters": slurm_parameters, "--ray-address": ray_address,
             "--gpus-per-run": gpus_per_run}
    foreign = [flag for flag, value in given.items()
               if value not in (None, []) and _FLAG_ENGINES[flag] != kind]
    if foreign:
        raise CrlValueError(f"{', '.join(foreign)}: a setting of --executor "
                            f"{_FLAG_ENGINES[foreign[0]]}, not of --executor {kind}")
    if kind == "local":
        return LocalExecutor(workers)
    require_extra(kind)
    if kind == "submitit":
        from crl.experiments.executors.submitit import SubmititExecutor

        return SubmititExecutor(partition=slurm_partition, time_limit=slurm_time,
                                gpus_per_run=slurm_gpus_per_run or 0, setup=slurm_setup,
                                parameters=slurm_parameters, array_parallelism=workers)
    from crl.experiments.executors.ray import RayExecutor

    return RayExecutor(ray_address, num_cpus=workers, gpus_per_run=gpus_per_run or 0)
