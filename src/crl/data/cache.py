"""Where crl caches what it computes once (mined pairs, frozen text features), the lock that
makes processes compute a missing entry once, and the call that fills the caches a set of
configs needs before parallel workers start (each data set declares how to fill its own)."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from crl.data.config import DataConfig

#: Environment variable that overrides the default cache directory.
CACHE_ENV = "CRL_CACHE_DIR"
#: Seconds since a file's last change after which its stat is trusted to show the next one.
SETTLED_S = 2.0


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


def settled_signature(paths: Sequence[Path]) -> tuple[tuple[int, int, int, int, int], ...] | None:
    """``(device, inode, size, mtime_ns, ctime_ns)`` of each file, or None when one of them
    changed in the last :data:`SETTLED_S` seconds.

    Two equal signatures of settled files mean the same bytes for any change made through the
    file system: a write, a rename over the file or ``os.utime`` sets ``ctime`` to the present,
    which a settled file's recorded ``ctime`` is not. File times come from a coarse clock, so a
    file written twice within one tick can show the same times: hence the wait, as git does for
    its index. For an in-process memo of work on the files' content.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "new.txt"
        >>> _ = path.write_text("just written")
        >>> settled_signature([path]) is None
        True
    """
    recent = time.time_ns() - int(SETTLED_S * 1e9)
    out = []
    for path in paths:
        st = os.stat(path)
        if st.st_ctime_ns > recent or st.st_mtime_ns > recent:
            return None
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


_T = TypeVar("_T")
#: The last result of each :func:`settled_memo` tag: ``tag -> (paths, signature, result)``.
_SETTLED: dict[tuple[Any, ...], tuple[tuple[str, ...], Any, Any]] = {}


def settled_memo(tag: tuple[Any, ...], paths: Sequence[Path], compute: Callable[[], _T]) -> _T:
    """``compute()``, a function of the content of the files ``paths``, or its result from this
    process's last call with the same ``tag`` when the same files are still settled and have
    the same :func:`settled_signature` (treat the result as read-only).

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "data.txt"
        >>> _ = path.write_text("x")
        >>> os.utime(path, (1, 1))  # times long past; ctime is now, so not settled yet
        >>> settled_memo(("doc",), [path], lambda: path.read_text())
        'x'
    """
    names = tuple(map(str, paths))
    signature = settled_signature(paths)
    last = _SETTLED.get(tag)
    if signature is not None and last is not None and last[:2] == (names, signature):
        return last[2]  # type: ignore[no-any-return]
    result = compute()
    if signature is not None:
        _SETTLED[tag] = (names, signature, result)
    return result


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
