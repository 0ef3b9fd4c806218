"""A directory crl writes into, and never out of (docs/errors.md, "Nothing written outside")."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from crl.errors import CrlError
from crl.rundir.files import append_jsonl, atomic_write, rewrite_jsonl, write_json


def _link_message(link: Path) -> str:
    return (f"{link} is a symbolic link (to {os.readlink(link)}); crl never writes through a "
            "link, so that nothing lands outside the directory it was given: remove the link "
            "or choose another --out")


class OutputDir:
    """A directory crl writes into, and never out of.

    Every path it writes lies inside :attr:`path`, and neither the directory nor anything on the
    way from it to the file may be a symbolic link: a link is refused, never followed (a planted
    link would otherwise turn a write into an overwrite of something elsewhere). The directory
    is created by the first write.

    Args:
        path: The directory (a run directory, a study directory).

    Example:
        >>> import tempfile
        >>> out = OutputDir(Path(tempfile.mkdtemp()) / "run")
        >>> out.write_json("summary.json", {"step": 3})
        >>> (out.path / "plots").symlink_to(tempfile.mkdtemp())
        >>> out.write_text("plots/curve.txt", "x")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        crl.errors.CrlError: .../run/plots is a symbolic link (to ...); crl never writes through ...
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def file(self, *parts: str) -> Path:
        """The path ``path/parts...``, checked: no symbolic link on the way, inside ``path``.

        Raises:
            CrlError: for a link, an absolute part or a path that resolves outside.
        """
        relative = Path(*parts)
        target = self.path / relative
        current = self.path
        for part in ("", *relative.parts):
            current = current / part if part else current
            if current.is_symlink():
                raise CrlError(_link_message(current))
        if relative.is_absolute() or not target.resolve().is_relative_to(self.path.resolve()):
            raise CrlError(f"{target} lies outside {self.path}; crl writes only inside the "
                           "directory it was given")
        return target

    def child(self, name: str) -> OutputDir:
        """The sub-directory ``name`` (a study's run directory), bound the same way."""
        return OutputDir(self.file(name))

    def mkdir(self) -> Path:
        """Create the directory (and its parents) unless it exists; returns it."""
        self.file().mkdir(parents=True, exist_ok=True)
        return self.path

    def refuse_links(self, depth: int = 1) -> None:
        """Refuse the directory if it, or an entry up to ``depth`` levels below it, is a symbolic
        link (a study checks its run directories once, before any is written).

        Raises:
            CrlError: naming the first link found.
        """
        self.file()

        def walk(folder: Path, level: int) -> None:
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                if entry.is_symlink():
                    raise CrlError(_link_message(Path(entry.path)))
                if level > 1 and entry.is_dir(follow_symlinks=False):
                    walk(Path(entry.path), level - 1)

        if self.path.is_dir():
            walk(self.path, depth)

    def atomic_write(self, name: str, write: Callable[[IO[bytes]], object]) -> None:
        """:func:`atomic_write` of the file ``name`` inside the directory."""
        atomic_write(self.file(name), write)

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        """:func:`write_json` of the file ``name`` inside the directory."""
        write_json(self.file(name), data)

    def write_text(self, name: str, text: str) -> None:
        """The text ``text`` (UTF-8) as the file ``name``, atomically."""
        self.atomic_write(name, lambda f: f.write(text.encode("utf-8")))

    def append_jsonl(self, name: str, record: dict[str, Any]) -> None:
        """:func:`append_jsonl` to the file ``name`` inside the directory."""
        append_jsonl(self.file(name), record)

    def rewrite_jsonl(self, name: str, records: Iterable[dict[str, Any]]) -> None:
        """:func:`rewrite_jsonl` of the file ``name`` inside the directory."""
        rewrite_jsonl(self.file(name), records)


__all__ = ["OutputDir"]
