"""Where crl caches what it computes once (mined pairs, frozen text features), the lock that
makes processes compute a missing entry once, and the call that fills the caches a set of
configs needs before parallel workers start (each data set declares how to fill its own)."""

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
    """Fill the on-disk caches the data configs need, once each: every data set that keeps one
    declares the hook that fills it (:data:`crl.data.load.DATA_SETS`; ``pycode`` mines its
    pairs).

    A study calls it before its workers start, so a missing cache is filled once, in the
    parent, instead of by every worker at the same time; a hook that fills under a file lock
    (:func:`locked`, as pycode's mining does) fills it once when two studies start together too.

    Args:
        configs: Data configs of the runs about to start, or their ``data`` sections as dicts;
            data sets without a cache are passed over, and so is a dict that is not a valid
            data config (its run reports the problem).
        progress: Show the hooks' progress bars.

    Returns:
        How many distinct caches were checked (they are now on disk): one per data set and
        distinct section of its options.
    """
    from crl.data.config import DataConfig
    from crl.data.load import DATA_SETS

    seen: set[tuple[str, str]] = set()
    for given in configs:
        try:
            cfg = given if isinstance(given, DataConfig) else DataConfig.model_validate(given)
        except ValueError:  # pydantic's ValidationError and CrlValueError
            continue
        hook = DATA_SETS[cfg.name].cache
        if hook is None:
            continue
        options = hook.options(cfg)
        key = (cfg.name, options.model_dump_json())
        if key not in seen:
            seen.add(key)
            hook.fill(options, progress)
    return len(seen)
