"""One writer per directory: the write lock of a run or study directory (docs/errors.md)."""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from crl.errors import CrlError
from crl.rundir.files import NOFOLLOW
from crl.rundir.output import OutputDir

#: The write lock of a run or study directory; it holds the holder's pid.
LOCK_FILE = ".lock"
#: How long a refusal waits for the holder's pid to appear in its lock file (:func:`_holder`).
_HOLDER_WAIT = 1.0

# The directories this process holds the lock of: (resolved path, pid, thread) -> lock file.
_HELD: dict[tuple[str, int, int], int] = {}
_HELD_GUARD = threading.Lock()


def _forget_held_in_child() -> None:
    # A forked child (a study's worker) gets copies of the lock files' descriptors, which would
    # keep the parent's locks alive after the parent dies: it closes them (the parent's own
    # descriptors, and so its locks, are untouched) and holds no lock of its own.
    for fd in _HELD.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_held_in_child)


@contextmanager
def lock_directory(folder: str | Path, *, blocking: bool) -> Iterator[None]:
    """Hold the write lock of ``folder`` for the block: one writer per run or study directory.

    The lock is an exclusive ``flock`` on ``<folder>/.lock``, which records the holder's pid.
    The operating system drops it when its process dies, ``kill -9`` included, so no stale lock
    is ever left to clear by hand. It is re-entrant in the thread that holds it (keyed by the
    resolved path): a study's worker locks a run directory and ``fit``'s writer locks it again.
    ``folder`` (and any missing parent) is created if missing and removed again on release when
    nothing was written to it; the lock file is removed on release.

    Args:
        folder: The directory (not a symbolic link).
        blocking: Wait while another process holds the lock (a study's worker: another live
            attempt at the same run) instead of failing at once (the command line).

    Raises:
        CrlError: without ``blocking``, when another process holds the lock (naming its pid);
            when ``folder`` is a symbolic link; when its file system has no working ``flock``.

    Example:
        >>> import tempfile
        >>> run = Path(tempfile.mkdtemp()) / "run"
        >>> with lock_directory(run, blocking=False):
        ...     with lock_directory(run, blocking=False):  # re-entrant
        ...         (run / LOCK_FILE).read_text().strip() == str(os.getpid())
        True
        >>> run.exists()  # made for the block, removed as nothing was written to it
        False
    """
    folder = OutputDir(folder).file()
    key = (str(folder.resolve()), os.getpid(), threading.get_ident())
    with _HELD_GUARD:
        held = key in _HELD
    if held:
        yield
        return
    made, fd = _acquire(folder, blocking=blocking)
    with _HELD_GUARD:
        _HELD[key] = fd
    try:
        yield
    finally:
        with _HELD_GUARD:
            del _HELD[key]
        _release(folder, fd, made=made)


def _acquire(folder: Path, *, blocking: bool) -> tuple[list[Path], int]:
    """Lock ``folder/.lock``; returns the folders made for it (deepest first) and the lock's
    descriptor."""
    made = []
    for missing in (folder, *folder.parents):
        if missing.exists():
            break
        made.append(missing)
    path = folder / LOCK_FILE
    while True:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | NOFOLLOW, 0o666)
        except FileNotFoundError:  # the folder was removed by the holder that just let go
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            raise _lock_error(folder, exc, holder) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder before us removed this file as it let go: lock the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode("ascii"))
    return made, fd


def _holder(fd: int) -> str:
    """The pid in a lock file another process holds. The holder writes it just after taking
    the lock, so an empty file is read again for up to :data:`_HOLDER_WAIT` seconds before the
    holder is called unknown."""
    deadline = time.monotonic() + _HOLDER_WAIT
    while True:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if holder or time.monotonic() >= deadline:
            return holder or "unknown"
        time.sleep(0.005)


def _lock_error(folder: Path, exc: OSError, holder: str) -> BaseException:
    if isinstance(exc, BlockingIOError):
        return CrlError(f"{folder} is being written by another crl process (pid {holder}); "
                        "wait for it to finish, or choose another --out")
    if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
        return CrlError(
            f"cannot lock {folder / LOCK_FILE}: {exc.strerror}; the directory must lie on a file "
            "system with working flock locks (NFS with its lock service, Lustre mounted with "
            "-o flock; see docs/distributed.md)")
    return exc


def _release(folder: Path, fd: int, *, made: list[Path]) -> None:
    try:
        # Removed while still held: a process waiting on this file sees it replaced and locks
        # the file that is there now, so two holders never hold two different files.
        (folder / LOCK_FILE).unlink(missing_ok=True)
    finally:
        os.close(fd)
    for empty in made:  # made for the lock: removed unless something was written there
        try:
            empty.rmdir()
        except OSError:
            break


__all__ = ["LOCK_FILE", "lock_directory"]
