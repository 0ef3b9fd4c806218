"""Errors crl raises for bad input or bad state.

Every message names the argument, what was expected and what came, and the fix when there is one.
The CLI prints a :class:`CrlError` as one line and exits with code 2; any other exception is a bug.
"""

from __future__ import annotations


class CrlError(Exception):
    """Base class of crl's user-facing errors (bad input, bad config, bad files)."""


class CrlValueError(CrlError, ValueError):
    """A value has the right type but is not acceptable (shape, range, NaN, unknown name...)."""


class CrlTypeError(CrlError, TypeError):
    """A value has the wrong type."""


class StaleRunError(CrlError):
    """A run directory holds work (a checkpoint or a finished run) of another resolved config or
    another crl version, so it cannot be resumed or returned for this config."""
