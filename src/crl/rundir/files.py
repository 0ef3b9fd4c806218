"""Atomic files: a crash never leaves a torn file, a failed write leaves no temporary behind.

``config.json``, ``summary.json`` and ``checkpoint.pt`` are written to a temporary file in the same
directory, flushed, fsync'ed and renamed over the target (``os.replace`` is atomic on POSIX and
Windows); the directory is then fsync'ed too, so the rename itself survives a power loss. A write
that fails removes its temporary file and names its target. ``metrics.jsonl`` is appended to and
flushed line by line; its reader drops a torn last line (a crash in the middle of a write).
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from crl.errors import CrlValueError

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
SUMMARY_FILE = "summary.json"
EVAL_FILE = "eval.json"
#: Opening a file with this flag fails (ELOOP) when its last component is a symbolic link.
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _umask() -> int:
    """The process umask, read without changing it where Linux allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_directory(folder: str | Path) -> None:
    """Flush a directory's entries (a rename, a new file) to disk; a no-op where the platform
    cannot open a directory (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a directory; the rename already happened
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write a file atomically: ``write(handle)`` into a temporary sibling, fsync, rename, fsync
    the directory. On any error the temporary file is removed, and an operating-system error
    names ``path`` (not the temporary name). A symbolic link at ``path`` is replaced, never
    followed.

    Raises:
        IsADirectoryError: if ``path`` is a directory (nothing is written).
        OSError: if the file cannot be written (naming ``path``).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> atomic_write(folder / "x.txt", lambda f: f.write(b"hello"))
        >>> (folder / "x.txt").read_text()
        'hello'
    """
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(errno.EISDIR, "it is a directory; give a file name", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            # mkstemp creates the file 0600; give it the mode a plain open() would (0666 minus
            # the umask), so collaborators on a shared machine can read the run directory.
            os.fchmod(handle.fileno(), 0o666 & ~_umask())
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        named = _naming(exc, tmp, path)
        if named is None:
            raise
        raise named from exc


def _naming(exc: BaseException, tmp: str | Path, path: Path) -> OSError | None:
    """For an operating-system error about the temporary ``tmp`` (or about no file: a full
    disk), the same error naming ``path``, the file the user knows; else None."""
    if isinstance(exc, OSError) and exc.filename in (None, str(tmp)):
        return OSError(exc.errno, exc.strerror or str(exc), str(path))
    return None


@contextmanager
def atomic_directory(out: str | Path) -> Iterator[Path]:
    """A staging directory beside ``out`` for the block to fill; renamed to ``out`` when the
    block ends, removed when it raises, so ``out`` never holds half a result and no staging
    directory is left behind.

    Raises:
        CrlValueError: if ``out`` is a symbolic link, a file or a directory that holds files.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "model"
        >>> with atomic_directory(out) as staging:
        ...     _ = (staging / "weights.bin").write_bytes(b"w")
        >>> [p.name for p in out.iterdir()], [p.name for p in out.parent.iterdir()]
        (['weights.bin'], ['model'])
    """
    out = Path(out)
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise CrlValueError(f"{out} already exists and is not an empty directory (or is a "
                            "symbolic link); choose another path")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp's 0700, as for atomic_write's files
        yield staging
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(staging, out)
        fsync_directory(out.parent)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        named = _naming(exc, staging, out)
        if named is None:
            raise
        raise named from exc


def remove_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files (``.<name>.<random>.tmp``) that writes interrupted by a crash
    left in ``folder``; call it only when no other process writes there (on resume).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / ".checkpoint.pt.x1y2.tmp").write_bytes(b"torn")
        >>> [p.name for p in remove_temporaries(folder)], list(folder.iterdir())
        (['.checkpoint.pt.x1y2.tmp'], [])
    """
    removed = [p for p in Path(folder).glob(".*.tmp") if p.is_file()]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def _clean(value: Any) -> Any:
    """JSON cannot hold NaN/Inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def as_written(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as :func:`read_json` reads it back after :func:`write_json` (tuples as lists,
    NaN as None), to compare a value with a file.

    Example:
        >>> as_written({"ns": (1, 2), "tolerance": float("nan")})
        {'ns': [1, 2], 'tolerance': None}
    """
    result: dict[str, Any] = json.loads(json.dumps(_clean(data), sort_keys=True))
    return result


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON (:func:`json_text`), atomically."""
    text = json_text(data) + "\n"
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


_SCALARS = (str, int, float, bool, type(None))


def json_text(value: Any) -> str:
    """``value`` as indented JSON with sorted keys and NaN/Inf as null, a list of scalars
    (numbers, strings, booleans, nulls) on one line: ``json.dumps(value, indent=2,
    sort_keys=True)`` puts each number of a split's 4,000 row indices on a line of its own, and
    its indenting encoder is pure Python, 10x slower than the one-line C encoder used for such
    lists here. The same value as :func:`json.dumps` writes, read back.

    Example:
        >>> print(json_text({"b": [1, 2.5, float("nan")], "a": {"x": [{"y": None}]}}))
        {
          "a": {
            "x": [
              {
                "y": null
              }
            ]
          },
          "b": [1, 2.5, null]
        }
    """
    return _render(value, "")


def _render(value: Any, pad: str) -> str:
    if isinstance(value, dict):
        if not value:
            return "{}"
        inner = pad + "  "
        items = sorted(value.items())  # json.dumps(sort_keys=True)'s order, its errors too
        return "{\n" + ",\n".join(f"{inner}{json.dumps(_key(k))}: {_render(v, inner)}"
                                  for k, v in items) + "\n" + pad + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        if all(isinstance(v, _SCALARS) for v in value):
            try:
                return json.dumps(value, allow_nan=False)
            except ValueError:  # NaN or Inf among them
                return json.dumps(_clean(value))
        inner = pad + "  "
        return "[\n" + ",\n".join(inner + _render(v, inner) for v in value) + "\n" + pad + "]"
    return json.dumps(_clean(value))


def _key(key: Any) -> str:
    """A dict key as JSON writes it: a string as it is, a number, boolean or None converted."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool) or key is None:
        return {True: "true", False: "false", None: "null"}[key]
    if isinstance(key, (int, float)):
        return json.dumps(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _text(path: Path) -> str:
    """The file's text; bytes that are not UTF-8 are one error naming the file and the offset."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CrlValueError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start}); crl wrote it as UTF-8 JSON, so it was damaged or "
                            "replaced: delete it or re-run") from None


def _loads(path: Path, text: str, where: str = "") -> Any:
    """``json.loads(text)``; any way it fails (bad syntax, nesting beyond the parser's
    recursion limit, an integer of more than 4300 digits) is one error naming ``path``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise CrlValueError(f"{path}: {where}nests its JSON deeper than the parser can "
                            "follow") from None
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        reason = str(exc) if len(str(exc)) <= 120 else str(exc)[:117] + "..."
        verb = "is " if where else ""
        raise CrlValueError(f"{path}: {where}{verb}not valid JSON ({reason})") from None


def read_json(path: str | Path) -> dict[str, Any]:
    """Read a JSON object written by :func:`write_json`."""
    path = Path(path)
    data = _loads(path, _text(path))
    if not isinstance(data, dict):
        raise CrlValueError(f"{path}: expected a JSON object; got {type(data).__name__}")
    return data


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one record as a line and flush it to disk (never through a symbolic link)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(_clean(record), sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a JSON-lines file; a torn (unterminated or unparsable) last line
    is dropped, a corrupt line elsewhere is an error.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "m.jsonl"
        >>> _ = p.write_text('{"step": 1}\\n{"step": 2}\\n{"ste')
        >>> read_jsonl(p)
        [{'step': 1}, {'step': 2}]
    """
    path = Path(path)
    if not path.exists():
        return []
    # Every complete record ends with a newline; text after the last newline is a torn write.
    complete, _, _torn = _text(path).rpartition("\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(complete.split("\n"), start=1):
        if not line.strip():
            continue
        record = _loads(path, line, f"line {number} ")
        if not isinstance(record, dict):
            raise CrlValueError(f"{path}: line {number} is not a JSON object")
        records.append(record)
    return records


def rewrite_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Replace a JSON-lines file atomically by ``records``."""
    text = "".join(json.dumps(_clean(r), sort_keys=True) + "\n" for r in records)
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


__all__ = [
    "CHECKPOINT_FILE",
    "CONFIG_FILE",
    "EVAL_FILE",
    "METRICS_FILE",
    "NOFOLLOW",
    "SUMMARY_FILE",
    "append_jsonl",
    "as_written",
    "atomic_directory",
    "atomic_write",
    "fsync_directory",
    "read_json",
    "read_jsonl",
    "remove_temporaries",
    "rewrite_jsonl",
    "write_json",
]
