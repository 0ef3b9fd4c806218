"""Where crl caches what it computes once (mined pairs, frozen text features)."""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable that overrides the default cache directory.
CACHE_ENV = "CRL_CACHE_DIR"


def resolve_cache_dir(configured: str | Path | None = None) -> Path:
    """The cache directory: ``configured`` if given, else ``$CRL_CACHE_DIR``, else ``~/.cache/crl``.

    The directory is not created here.

    Example:
        >>> str(resolve_cache_dir("/tmp/x"))
        '/tmp/x'
    """
    if configured is not None:
        return Path(configured).expanduser()
    env = os.environ.get(CACHE_ENV, "")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "crl"
