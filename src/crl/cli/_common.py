"""What every sub-command shares: one-line errors with exit code 2, ``--debug``, and the
``--trust-factory`` opt-in of the commands that open a run directory."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from typer.core import TyperGroup

from crl.errors import CrlError

F = TypeVar("F", bound=Callable[..., Any])

#: Exit code for bad input (a config, a file, an argument).
EXIT_BAD_INPUT = 2

#: ``--trust-factory MODULE:FN`` of ``crl eval``/``encode``/``export``: a run directory is data,
#: so the ``model.kind: custom`` factory its config names is imported only when named here.
TRUST_FACTORY = typer.Option(
    None, "--trust-factory", metavar="MODULE:FN",
    help="Import this model.factory of a `model.kind: custom` run (it must match the run's); "
         "without it such a run is refused, since its config.json names code to run.")


def trusted_factories(trust_factory: str | None) -> frozenset[str]:
    """The factories the user named on the command line (``--trust-factory``).

    Example:
        >>> sorted(trusted_factories("towers:build")), trusted_factories(None)
        (['towers:build'], frozenset())
    """
    return frozenset() if trust_factory is None else frozenset({trust_factory})


def debug_enabled() -> bool:
    """True when ``--debug`` was given (or ``CRL_DEBUG=1``): errors then show the traceback."""
    return os.environ.get("CRL_DEBUG", "") not in ("", "0")


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    """Print ``error: message`` on one line to stderr and return the Exit to raise."""
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(code)


def error_line(exc: BaseException) -> str:
    """The one-line message of an error: crl's own text, or for an operating-system error
    (unwritable directory, full disk, a file where a directory should be) the path, the reason
    and what to check.

    Example:
        >>> error_line(NotADirectoryError(20, "Not a directory", "out/run"))[:36]
        'cannot use out/run: Not a directory;'
    """
    if isinstance(exc, OSError) and not isinstance(exc, CrlError) and exc.filename is not None:
        return (f"cannot use {exc.filename}: {exc.strerror or type(exc).__name__}; check the "
                "path, its permissions and the free disk space")
    return str(exc).strip().replace("\n", " | ") or type(exc).__name__


def handle_errors(fn: F) -> F:
    """Turn crl's errors and operating-system errors (missing, unreadable or unwritable files,
    a full disk) into one line and exit code 2 (``--debug``: the traceback instead)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (CrlError, OSError) as exc:
            if debug_enabled():
                raise
            raise fail(error_line(exc)) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def usage_line(exc: typer.TyperException) -> str:
    """A usage error (unknown option, a value of the wrong type, a missing argument) as one line:
    the command, click's message and where the help is.

    Example:
        >>> usage_line(typer.BadParameter("'abc' is not a valid integer"))
        "Invalid value: 'abc' is not a valid integer"
    """
    format_message = getattr(exc, "format_message", None)
    message = " ".join((format_message() if callable(format_message) else str(exc)).split())
    context = getattr(exc, "ctx", None)
    if context is None:
        return message
    return f"{context.command_path}: {message} (see {context.command_path} --help)"


class OneLineErrorsGroup(TyperGroup):
    """The ``crl`` group: a usage error is one line ``error: ...`` on stderr with exit code 2,
    like crl's own errors (:func:`handle_errors`), instead of click's boxed usage text
    (``--debug``: the exception with its traceback)."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False,
                                windows_expand_args=windows_expand_args, **extra)
        except typer.TyperException as exc:  # click's usage errors
            if not standalone_mode or debug_enabled():
                raise
            print(f"error: {usage_line(exc)}", file=sys.stderr)
            sys.exit(int(getattr(exc, "exit_code", EXIT_BAD_INPUT)))
        except typer.Abort:
            if not standalone_mode:
                raise
            print("Aborted!", file=sys.stderr)
            sys.exit(1)
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)
