"""``--executor submitit``: a study's runs as the jobs of a Slurm job array, through submitit.

Each task of the study (a run) is one job (one task on one node,
:class:`crl._submitit_job.SubmititRun`) that calls ``task.run()`` (for a run, the shared worker
:func:`crl.experiments.executors.base.run_task`). A job that reaches its time
limit gets submitit's signal (``USR2``, ``signal_delay_s`` = 90 s before the limit): submitit
then calls the job's ``checkpoint`` (the :class:`submitit.helpers.Checkpointable` protocol),
which resubmits the same run, requeues the job and ends it. The run's state is already on disk:
``fit`` writes ``checkpoint.pt`` every ``train.checkpoint_every`` steps or
``train.checkpoint_every_s`` seconds (a study's runs: every 60 s), so the requeued job resumes
from the last checkpoint and reaches the summary an uninterrupted run writes (resumes are
exact); the steps since that checkpoint are trained again.

The run directories and submitit's job folder (``<study dir>/submitit/``) must lie on a file
system that the login node and every compute node see (docs/distributed.md).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Self

from crl._yaml import load_yaml
from crl.errors import CrlValueError
from crl.experiments.executors.base import (
    EngineOptions,
    Executor,
    Flag,
    RunOutcome,
    Task,
    check_gpus,
    first_line,
    lost_outcomes,
)

if TYPE_CHECKING:  # submitit is imported when an executor is made (the extra may be missing)
    import submitit

CLUSTERS = ("slurm", "local")
#: What submitit's local executor takes (it runs the jobs as processes of this machine).
LOCAL_PARAMETERS = frozenset({"timeout_min", "signal_delay_s", "setup", "gpus_per_node",
                              "visible_gpus", "tasks_per_node", "nodes", "stderr_to_stdout"})
#: Default time limit of a job when neither --slurm-time nor the parameters give one.
DEFAULT_TIME_MIN = 240
#: How many times a run may reach its time limit (and be requeued) before it counts as failed.
DEFAULT_MAX_TIMEOUTS = 10
_SLURM_TIME = re.compile(
    r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")


def parse_slurm_time(value: str | int) -> int:
    """Minutes of a Slurm time limit (``--slurm-time``), rounded up.

    Slurm's formats: ``minutes``, ``minutes:seconds``, ``hours:minutes:seconds``, ``days-hours``,
    ``days-hours:minutes``, ``days-hours:minutes:seconds``.

    Raises:
        CrlValueError: for anything else, or a limit of zero.

    Example:
        >>> [parse_slurm_time(t) for t in (90, "90", "1:30", "2:00:00", "1-12", "0-0:30:01")]
        [90, 90, 2, 120, 2160, 31]
    """
    text = str(value).strip()
    match = _SLURM_TIME.match(text)
    if match is None:
        raise CrlValueError(f"--slurm-time must be minutes or Slurm's [days-]hours:minutes:seconds "
                            f"(e.g. 240, 4:00:00, 1-00:00:00); got {value!r}")
    days, a, b, c = (int(match[g]) if match[g] is not None else None
                     for g in ("days", "a", "b", "c"))
    if days is not None:  # days-hours[:minutes[:seconds]]
        seconds = ((days * 24 + (a or 0)) * 60 + (b or 0)) * 60 + (c or 0)
    elif c is not None:  # hours:minutes:seconds
        seconds = ((a or 0) * 60 + (b or 0)) * 60 + c
    else:  # minutes[:seconds]
        seconds = (a or 0) * 60 + (b or 0)
    if seconds <= 0:
        raise CrlValueError(f"--slurm-time must be a positive time limit; got {value!r}")
    return -(-seconds // 60)


def load_parameters(path: str | Path) -> dict[str, Any]:
    """Read a YAML file of submitit parameters (``--slurm-parameters``): a mapping of the keyword
    arguments of ``submitit.SlurmExecutor.update_parameters`` (sbatch's options: ``account``,
    ``qos``, ``mem``, ``constraint``, ``additional_parameters``...), plus optionally
    ``cluster: local`` (submitit's local executor, which runs every job at once on this machine)
    and ``max_num_timeout``.

    Raises:
        CrlValueError: when the file is missing or is not a YAML mapping.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CrlValueError(f"--slurm-parameters: cannot read {path}: "
                            f"{exc.strerror or exc}") from None
    data = load_yaml(text, f"--slurm-parameters: {path}")  # limits on aliases and depth
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise CrlValueError(f"--slurm-parameters: {path} must hold a mapping of submitit "
                            f"parameters (name: value); got {type(data).__name__}")
    return data


@dataclass(frozen=True)
class SubmititOptions(EngineOptions):
    """The flags of ``--executor submitit``."""

    slurm_partition: Annotated[str | None, Flag(
        "submitit: the Slurm partition of the jobs.")] = None
    slurm_time: Annotated[str | None, Flag(
        "submitit: each job's time limit, minutes or [days-]hh:mm:ss (default 4:00:00); a run "
        "that reaches it is requeued and resumes.")] = None
    slurm_gpus_per_run: Annotated[int | None, Flag(
        "submitit: GPUs of each job (with --device cuda).")] = None
    slurm_setup: Annotated[list[str] | None, Flag(
        "submitit: a shell line run before each job, e.g. 'source .venv/bin/activate' "
        "(repeatable).", metavar="LINE")] = None
    slurm_parameters: Annotated[Path | None, Flag(
        "submitit: a YAML file of more submitit parameters (account, qos, mem, constraint, "
        "...).", metavar="YAML")] = None


class SubmititExecutor(Executor):
    """A Slurm job array through submitit, one job per run.

    Args:
        partition: ``--slurm-partition``.
        time_limit: ``--slurm-time``: the time limit of each job (minutes or Slurm's format; default
            4 hours). A run longer than that is requeued and resumes.
        gpus_per_run: ``--slurm-gpus-per-run``: GPUs of each job (for ``--device cuda``).
        cpus_per_run: CPUs of each job, also the torch threads of its run (default: the
            parameters' ``cpus_per_task``, else 1).
        setup: ``--slurm-setup``: shell lines run before each job (``module load ...``,
            ``source .venv/bin/activate``).
        parameters: More submitit parameters (a mapping, or the path of a YAML file: see
            :func:`load_parameters`); the flags above win over it.
        array_parallelism: At most this many jobs of the array at once (``--workers``).
        cluster: ``slurm``, or ``local`` for submitit's local executor (tests, trying a study's
            jobs on one machine: it starts every job at once).
        poll_s: Seconds between two looks at the jobs' states.

    Raises:
        CrlValueError: for bad settings, or ``slurm`` where ``sbatch`` is not on the PATH.
    """

    kind = "submitit"
    summary = "a Slurm job array"
    Options = SubmititOptions
    requires = ("submitit", "slurm")

    def __init__(self, *, partition: str | None = None, time_limit: str | int | None = None,
                 gpus_per_run: int = 0, cpus_per_run: int | None = None,
                 setup: Sequence[str] = (),
                 parameters: Mapping[str, Any] | str | Path | None = None,
                 array_parallelism: int | None = None, cluster: str | None = None,
                 poll_s: float = 2.0) -> None:
        self._submitit = self.import_engine()
        given = (dict(load_parameters(parameters)) if isinstance(parameters, (str, Path))
                 else dict(parameters or {}))
        cluster = str(given.pop("cluster", "slurm") if cluster is None else cluster)
        if cluster not in CLUSTERS:
            raise CrlValueError(f"submitit: cluster must be one of {', '.join(CLUSTERS)}; "
                                f"got {cluster!r}")
        if cluster == "slurm" and shutil.which("sbatch") is None:
            raise CrlValueError(
                "--executor submitit: Slurm's sbatch is not on the PATH here; run the study on "
                "the cluster's login node (or give the parameter cluster: local to try the "
                "jobs on this machine)")
        cpus_per_run = int(given.pop("cpus_per_task", 1) if cpus_per_run is None else cpus_per_run)
        if cpus_per_run < 1:
            raise CrlValueError(f"submitit: cpus_per_run must be >= 1; got {cpus_per_run}")
        self.cluster = cluster
        self.max_num_timeout = int(given.pop("max_num_timeout", DEFAULT_MAX_TIMEOUTS))
        self.gpus_per_run = gpus_per_run
        self.cpus_per_run = cpus_per_run
        self.poll_s = poll_s
        self.parameters = self._parameters(given, partition=partition, time_limit=time_limit,
                                           gpus_per_run=gpus_per_run, setup=list(setup),
                                           array_parallelism=array_parallelism)

    @classmethod
    def from_options(cls, workers: int | None, options: SubmititOptions) -> Self:
        """``--executor submitit`` with ``--workers`` (jobs at once) and its flags."""
        return cls(partition=options.slurm_partition, time_limit=options.slurm_time,
                   gpus_per_run=options.slurm_gpus_per_run or 0,
                   setup=options.slurm_setup or (), parameters=options.slurm_parameters,
                   array_parallelism=workers)

    def _parameters(self, given: dict[str, Any], *, partition: str | None,
                    time_limit: str | int | None, gpus_per_run: int, setup: list[str],
                    array_parallelism: int | None) -> dict[str, Any]:
        """submitit's parameters for the cluster: the given ones, then the flags over them."""
        if self.cluster == "slurm":
            valid = set(self._submitit.SlurmExecutor._valid_parameters())
            flags: dict[str, Any] = {"nodes": 1, "ntasks_per_node": 1,
                                     "cpus_per_task": self.cpus_per_run}
            time_key = "time"
            if partition is not None:
                flags["partition"] = partition
            if array_parallelism is not None:
                flags["array_parallelism"] = array_parallelism
        else:
            valid = set(LOCAL_PARAMETERS)
            flags = {"nodes": 1, "tasks_per_node": 1}
            time_key = "timeout_min"
            if partition is not None or array_parallelism is not None:
                raise CrlValueError("submitit's local cluster takes no partition and no "
                                    "--workers (it starts every job at once)")
        unknown = sorted(set(given) - valid)
        if unknown:
            raise CrlValueError(f"submitit parameters for the {self.cluster} cluster: unknown "
                                f"{', '.join(map(repr, unknown))}; valid are "
                                f"{', '.join(sorted(valid))}")
        if time_limit is not None:
            flags[time_key] = parse_slurm_time(time_limit)
        if gpus_per_run:
            flags["gpus_per_node"] = gpus_per_run
        if setup:
            flags["setup"] = list(given.get("setup", [])) + setup
        return {time_key: DEFAULT_TIME_MIN, **given, **flags}

    def run(self, tasks: Sequence[Task], study_dir: Path) -> Iterator[RunOutcome]:
        import cloudpickle  # submitit's own dependency

        from crl._submitit_job import SubmititRun

        check_gpus("--slurm-gpus-per-run", self.gpus_per_run, tasks)
        if not tasks:
            return
        folder = study_dir / "submitit" / "%j"
        executor: submitit.Executor
        if self.cluster == "slurm":
            executor = self._submitit.SlurmExecutor(folder, max_num_timeout=self.max_num_timeout)
            parameters = {"job_name": f"crl-{tasks[0].study.name}", **self.parameters}
        else:
            executor = self._submitit.LocalExecutor(folder, max_num_timeout=self.max_num_timeout)
            parameters = dict(self.parameters)
        try:
            executor.update_parameters(**parameters)
        except (ValueError, TypeError, NameError) as exc:
            raise CrlValueError(f"submitit parameters: {str(exc).splitlines()[0]}") from None
        jobs = executor.submit_array([
            SubmititRun(cloudpickle.dumps(t.with_threads(self.cpus_per_run))) for t in tasks])
        pending: dict[submitit.Job[list[RunOutcome]], Task] = dict(zip(jobs, tasks, strict=True))
        try:
            while pending:
                for job in [j for j in pending if j.done()]:
                    yield from _job_outcomes(job, pending.pop(job))
                if pending:
                    time.sleep(self.poll_s)
        except BaseException:  # Ctrl-C, or the caller stopped listening: cancel what is left
            for job in pending:
                job.cancel(check=False)
            raise


def _job_outcomes(job: submitit.Job[list[RunOutcome]], task: Task) -> list[RunOutcome]:
    try:
        return job.result()
    except Exception as exc:  # the job itself failed: killed, out of memory, out of requeues
        return lost_outcomes(task, exc, f"submitit job {job.job_id}: {first_line(exc)}")
