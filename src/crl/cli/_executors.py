"""``--executor`` and its settings, shared by every ``crl study NAME`` command.

:func:`executor_options` adds the flags to a command's signature (typer reads it) and hands the
command one built :class:`~crl.experiments.executors.Executor` in its ``executor`` argument, so
each study command stays a few lines and the flags are declared once.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS: list[tuple[str, Any, Any]] = [
    ("executor", str, typer.Option(
        "local", "--executor", help="Where the runs execute: local (a process pool, the "
        "default), submitit (a Slurm job array; pip install 'crl\\[slurm]') or ray (Ray "
        "tasks; pip install 'crl\\[ray]'). See docs/distributed.md.")),
    ("slurm_partition", str | None, typer.Option(
        None, "--slurm-partition", help="submitit: the Slurm partition of the jobs.")),
    ("slurm_time", str | None, typer.Option(
        None, "--slurm-time", help="submitit: each job's time limit, minutes or "
        "\\[days-]hh:mm:ss (default 4:00:00); a run that reaches it is requeued and resumes.")),
    ("slurm_gpus_per_run", int | None, typer.Option(
        None, "--slurm-gpus-per-run", help="submitit: GPUs of each job (with --device cuda).")),
    ("slurm_setup", list[str] | None, typer.Option(
        None, "--slurm-setup", metavar="LINE", help="submitit: a shell line run before each "
        "job, e.g. 'source .venv/bin/activate' (repeatable).")),
    ("slurm_parameters", Path | None, typer.Option(
        None, "--slurm-parameters", metavar="YAML", help="submitit: a YAML file of more "
        "submitit parameters (account, qos, mem, constraint, ...).")),
    ("ray_address", str | None, typer.Option(
        None, "--ray-address", help="ray: a running Ray cluster (default: a local Ray started "
        "for the study with --workers CPUs).")),
    ("gpus_per_run", int | None, typer.Option(
        None, "--gpus-per-run", help="ray: GPUs reserved by each run (with --device cuda).")),
]


def executor_options(command: F) -> F:
    """Give ``command`` (which takes ``workers`` and ``executor``) the executor flags.

    The wrapper's signature is the command's without ``executor``, plus the flags; it builds
    the executor with :func:`crl.experiments.executors.build_executor` (a bad flag is one
    ``CrlValueError``) and calls the command with it.
    """
    signature = inspect.signature(command)
    kept = [p for p in signature.parameters.values() if p.name != "executor"]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                               annotation=annotation) for name, annotation, option in _OPTIONS]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from crl.experiments.executors import build_executor

        settings = {name: kwargs.pop(name) for name, _, _ in _OPTIONS}
        kind = settings.pop("executor")
        settings["slurm_setup"] = settings["slurm_setup"] or ()
        executor = build_executor(kind, workers=kwargs.get("workers"), **settings)
        return command(*args, executor=executor, **kwargs)

    positional = [p for p in kept if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p in kept if p.kind is inspect.Parameter.KEYWORD_ONLY]
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*positional, *keyword, *added])
    wrapper.__annotations__ = {
        **{k: v for k, v in command.__annotations__.items() if k != "executor"},
        **{name: annotation for name, annotation, _ in _OPTIONS}}
    return wrapper  # type: ignore[return-value]
