"""Executors by name (``crl study NAME --executor KIND``), each with the flags it declares.

An engine is one :class:`~crl.experiments.executors.base.Executor` subclass in :data:`ENGINES`:
its :attr:`~crl.experiments.executors.base.Executor.Options` are its flags (the CLI reads them
through :func:`engine_options`), and :func:`build_executor` hands it only its own.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from crl._validation import check_choice
from crl.errors import CrlValueError
from crl.experiments.executors.base import EngineOptions, Executor, Flag
from crl.experiments.executors.local import LocalExecutor
from crl.experiments.executors.ray import RayExecutor
from crl.experiments.executors.submitit import SubmititExecutor

#: The executors by name, the default first.
ENGINES: dict[str, type[Executor]] = {
    engine.kind: engine for engine in (LocalExecutor, SubmititExecutor, RayExecutor)}
#: Their names (``--executor KIND``).
EXECUTORS: tuple[str, ...] = tuple(ENGINES)


@dataclass(frozen=True)
class EngineOption:
    """One flag of one engine, as :func:`engine_options` lists it.

    Attributes:
        kind: The engine (``--executor KIND``) the flag belongs to.
        name: The keyword of :func:`build_executor` (``slurm_time``).
        annotation: What it takes (``str | None``; ``list[str] | None`` for a repeatable flag).
        help: The flag's help text.
        metavar: The flag's value in the help (None: typer's default).
    """

    kind: str
    name: str
    annotation: Any
    help: str
    metavar: str | None

    @property
    def flag(self) -> str:
        """The command-line flag (``--slurm-time``)."""
        return "--" + self.name.replace("_", "-")


def _option(kind: str, options: type[EngineOptions], name: str) -> EngineOption:
    """The flag of the field ``name`` of an engine's options (its ``Annotated[T, Flag]``)."""
    hint = typing.get_type_hints(options, include_extras=True)[name]
    flags = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Flag)]
    if not flags:
        raise TypeError(f"{options.__name__}.{name} must be annotated Annotated[T | None, "
                        f"Flag(help)]; got {hint!r}")
    return EngineOption(kind, name, hint.__origin__, flags[0].help, flags[0].metavar)


def engine_options() -> list[EngineOption]:
    """Every engine's flags, engine after engine in :data:`ENGINES`' order.

    Raises:
        TypeError: when two engines declare the same flag (a flag names one engine).

    Example:
        >>> [o.flag for o in engine_options() if o.kind == "ray"]
        ['--ray-address', '--gpus-per-run']
    """
    options = [_option(kind, engine.Options, f.name) for kind, engine in ENGINES.items()
               for f in dataclasses.fields(engine.Options)]
    names = [o.name for o in options]
    if len(set(names)) != len(names):
        raise TypeError(f"executor flags declared twice: {sorted(names)}")
    return options


def build_executor(kind: str = "local", *, workers: int | None = None,
                   **options: Any) -> Executor:
    """The executor of ``crl study NAME --executor KIND``, ``--workers`` and the engine's flags.

    Args:
        kind: A name in :data:`ENGINES` (``local``, ``submitit`` or ``ray``).
        workers: ``local``: parallel runs (default: the cores); ``submitit``: at most this many
            jobs of the array at once; ``ray``: the CPUs of the local Ray started for the study.
        **options: Flags by keyword (``slurm_time="4:00:00"`` for ``--slurm-time``); None or an
            empty list is a flag not given. Each engine's are listed by :func:`engine_options`
            (docs/distributed.md says what each one does).

    Raises:
        CrlValueError: for an unknown kind, a flag of another executor, an unknown flag, bad
            settings (checked by the engine), or an engine that is not installed (the message
            names the extra that installs it).

    Example:
        >>> build_executor("local", workers=2).workers
        2
    """
    check_choice("crl study", "--executor", kind, ENGINES)
    owners = {o.name: o for o in engine_options()}
    unknown = sorted(set(options) - set(owners))
    if unknown:
        raise CrlValueError(f"build_executor: unknown option {', '.join(map(repr, unknown))}; "
                            f"valid are {', '.join(sorted(owners))}")
    given = {name: value for name, value in options.items() if value not in (None, [], ())}
    foreign = [owners[name] for name in given if owners[name].kind != kind]
    if foreign:
        raise CrlValueError(f"{', '.join(o.flag for o in foreign)}: a setting of --executor "
                            f"{foreign[0].kind}, not of --executor {kind}")
    engine = ENGINES[kind]
    if engine.requires is not None:
        engine.import_engine()
    return engine.from_options(workers, engine.Options(**given))


def require_extra(kind: str) -> ModuleType:
    """Import the package the executor ``kind`` runs on, or say in one line which extra of crl
    installs it.

    Raises:
        CrlValueError: for an unknown kind, or when the package is not installed.
    """
    check_choice("crl study", "--executor", kind, ENGINES)
    return ENGINES[kind].import_engine()
