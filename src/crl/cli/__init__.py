"""The ``crl`` command: a few lines per sub-command over the Python API.

Each sub-command lives in its own module and registers itself on :data:`app` here.
"""

from __future__ import annotations

import os

import typer

from crl import __version__
from crl.cli._common import OneLineErrorsGroup

app = typer.Typer(
    name="crl",
    cls=OneLineErrorsGroup,
    help=(
        "Contrastive representation learning: losses, negatives as their own axis, "
        "checkable theory, and studies of how many negatives your data can use."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        print(f"crl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    # The variable reaches worker processes too. Undo what an earlier in-process invocation
    # (a test, a notebook calling app()) set, but never a CRL_DEBUG the user exported.
    global _debug_set_here
    if debug:
        _debug_set_here = _debug_set_here or "CRL_DEBUG" not in os.environ
        os.environ["CRL_DEBUG"] = "1"
    elif _debug_set_here:
        os.environ.pop("CRL_DEBUG", None)
        _debug_set_here = False


_debug_set_here = False


def _register() -> None:
    # Imported for their side effect of adding commands to `app`.
    from crl.cli import bench as _bench  # noqa: F401
    from crl.cli import encode as _encode  # noqa: F401
    from crl.cli import eval as _eval  # noqa: F401
    from crl.cli import export as _export  # noqa: F401
    from crl.cli import info as _info  # noqa: F401
    from crl.cli import mine as _mine  # noqa: F401
    from crl.cli import study as _study  # noqa: F401
    from crl.cli import study_batch as _study_batch  # noqa: F401
    from crl.cli import train as _train  # noqa: F401


_register()


def main() -> None:
    """Entry point of the ``crl`` console script."""
    app()
