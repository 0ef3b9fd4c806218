"""Where crl caches what it computes once (mined pairs, frozen text features), the lock that
makes processes compute a missing entry once, and the call that fills the caches a set of
configs needs before parallel workers start."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crl.data.config import DataConfig

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


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created, with its folder, if missing) for the
    block: a second process (or a second open of the file in this one) waits until it ends.

    Example:
        >>> import tempfile
        >>> with locked(Path(tempfile.mkdtemp()) / "x.lock"):
        ...     pass
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def prepare_data_caches(configs: Iterable[DataConfig | Mapping[str, Any]], *,
                        progress: bool = True) -> int:
    """Fill the on-disk caches the data configs need (mined ``pycode`` pairs), once each.

    A study calls it before its workers start, so a missing cache is mined once, in the
    parent, instead of by every worker at the same time; the mining itself holds a file lock
    (:func:`locked`), so two studies started together mine it once too.

    Args:
        configs: Data configs of the runs about to start, or their ``data`` sections as dicts;
            kinds other than pycode need no cache, and a dict that is not a valid data config
            is passed over (its run reports the problem).
        progress: Show the mining progress bar.

    Returns:
        How many distinct pycode configs were checked (their caches are now on disk).
    """
    from crl.data.config import DataConfig
    from crl.data.pycode import load_pycode_pairs

    seen: set[str] = set()
    for given in configs:
        try:
            cfg = given if isinstance(given, DataConfig) else DataConfig.model_validate(given)
        except ValueError:  # pydantic's ValidationError and CrlValueError
            continue
        if cfg.name != "pycode":
            continue
        key = cfg.pycode.model_dump_json()
        if key not in seen:
            seen.add(key)
            load_pycode_pairs(cfg.pycode, progress=progress)
    return len(seen)
