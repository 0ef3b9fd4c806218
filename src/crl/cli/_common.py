"""What every sub-command shares: one-line errors with exit code 2, and ``--debug``."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from crl.errors import CrlError

F = TypeVar("F", bound=Callable[..., Any])

#: Exit code for bad input (a config, a file, an argument).
EXIT_BAD_INPUT = 2


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
