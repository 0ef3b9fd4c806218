"""``--executor`` and its settings, shared by every ``crl study NAME`` command.

:func:`executor_options` adds the flags to a command's signature (typer reads it) and hands the
command one built :class:`~crl.experiments.executors.base.Executor` in its ``executor``
argument, so each study command stays a few lines. The flags are the engines' own declarations
(:func:`crl.experiments.executors.registry.engine_options`): a new engine brings its flags.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from crl.experiments.executors.registry import (
    ENGINES,
    EngineOption,
    build_executor,
    engine_options,
)

F = TypeVar("F", bound=Callable[..., Any])


def _executor_help() -> str:
    """``--executor``'s help: each engine with its summary and the extra that installs it."""
    kinds = [f"{kind} ({engine.summary}"
             + (f"; pip install 'crl[{engine.requires[1]}]')" if engine.requires else ")")
             for kind, engine in ENGINES.items()]
    return (f"Where the runs execute: {', '.join(kinds[:-1])} or {kinds[-1]}. "
            "See docs/distributed.md.")


def _escaped(text: str) -> str:
    """``text`` as typer's help (rich markup) shows it: ``[`` escaped."""
    return text.replace("[", "\\[")


def _typer_option(option: EngineOption) -> Any:
    """The typer option of an engine's flag (not given: None)."""
    return typer.Option(None, option.flag, help=_escaped(option.help), metavar=option.metavar)


def executor_options(command: F) -> F:
    """Give ``command`` (which takes ``workers`` and ``executor``) the executor flags.

    The wrapper's signature is the command's without ``executor``, plus ``--executor`` and every
    engine's flags; it builds the executor with
    :func:`crl.experiments.executors.registry.build_executor` (a bad flag is one
    ``CrlValueError``) and calls the command with it.
    """
    options = engine_options()
    signature = inspect.signature(command)
    kept = [p for p in signature.parameters.values() if p.name != "executor"]
    choice = typer.Option("local", "--executor", help=_escaped(_executor_help()))
    added = [inspect.Parameter("executor", inspect.Parameter.KEYWORD_ONLY, default=choice,
                               annotation=str),
             *(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY,
                                 default=_typer_option(o), annotation=o.annotation)
               for o in options)]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kind = kwargs.pop("executor")
        settings = {o.name: kwargs.pop(o.name) for o in options}
        executor = build_executor(kind, workers=kwargs.get("workers"), **settings)
        return command(*args, executor=executor, **kwargs)

    positional = [p for p in kept if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p in kept if p.kind is inspect.Parameter.KEYWORD_ONLY]
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*positional, *keyword, *added])
    wrapper.__annotations__ = {
        **{k: v for k, v in command.__annotations__.items() if k != "executor"},
        **{p.name: p.annotation for p in added}}
    return wrapper  # type: ignore[return-value]
