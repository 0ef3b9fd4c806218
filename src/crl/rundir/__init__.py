"""The files of a run directory (docs/training.md), written so a crash never leaves a torn file,
nothing lands outside the directory, and one process at a time writes it (docs/errors.md).

``config.json``, ``summary.json`` and ``checkpoint.pt`` are written to a temporary file in the same
directory, flushed, fsync'ed and renamed over the target (``os.replace`` is atomic on POSIX and
Windows); the directory is then fsync'ed too, so the rename itself survives a power loss. A write
that fails removes its temporary file and names its target. ``metrics.jsonl`` is appended to and
flushed line by line; its reader drops a torn last line (a crash in the middle of a write).

:class:`OutputDir` binds those writes to a directory: every path it writes lies inside it, and
neither the directory nor anything on the way below it may be a symbolic link (refused, never
followed), so a link planted in a run or study directory cannot make crl write elsewhere.
:func:`lock_directory` (``<dir>/.lock``, an ``flock`` that dies with its process) keeps a second
writer out. The trainer, the studies and ``crl encode``/``crl export`` import these helpers from
here.
"""

from __future__ import annotations

from crl.rundir.files import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    EVAL_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    append_jsonl,
    as_written,
    atomic_directory,
    atomic_write,
    fsync_directory,
    read_json,
    read_jsonl,
    remove_temporaries,
    rewrite_jsonl,
    write_json,
)
from crl.rundir.lock import LOCK_FILE, lock_directory
from crl.rundir.output import OutputDir

__all__ = [
    "CHECKPOINT_FILE",
    "CONFIG_FILE",
    "EVAL_FILE",
    "LOCK_FILE",
    "METRICS_FILE",
    "SUMMARY_FILE",
    "OutputDir",
    "append_jsonl",
    "as_written",
    "atomic_directory",
    "atomic_write",
    "fsync_directory",
    "lock_directory",
    "read_json",
    "read_jsonl",
    "remove_temporaries",
    "rewrite_jsonl",
    "write_json",
]
