"""The in-process memo of work on files' content (``crl.data.cache.settled_memo``) and its use
for pycode's source fingerprint: unchanged settled files are not read again; any change is seen."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from crl.data import PycodeConfig, cache, pycode
from crl.data.cache import settled_memo, settled_signature
from crl.data.pycode import load_pycode_pairs

SOURCE = 'def area(r):\n    """Return the area of a circle of radius r."""\n    return 3 * r * r\n'


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "_SETTLED", {})
    monkeypatch.setattr(pycode, "_MEMO", {})


def _rewrite_keeping_times(path: Path, text: str) -> None:
    """Other bytes of the same size, the old atime and mtime put back (only ctime moves)."""
    stat = path.stat()
    time.sleep(0.05)  # past the coarse clock's tick, so ctime moves
    path.write_text(text)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns


def _reader(path: Path, calls: list[int]) -> Any:
    def read() -> str:
        calls.append(1)
        return path.read_text()
    return read


def test_settled_files_are_read_once_and_a_change_is_seen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "SETTLED_S", 0.0)
    path, calls = tmp_path / "a.txt", []
    path.write_text("first")
    assert settled_memo(("t",), [path], _reader(path, calls)) == "first"
    assert settled_memo(("t",), [path], _reader(path, calls)) == "first"
    assert len(calls) == 1
    assert settled_memo(("other tag",), [path], _reader(path, calls)) == "first"
    assert len(calls) == 2
    _rewrite_keeping_times(path, "FIRST")
    assert settled_memo(("t",), [path], _reader(path, calls)) == "FIRST"
    assert len(calls) == 3
    second = tmp_path / "b.txt"
    second.write_text("x")
    settled_memo(("t",), [path, second], _reader(path, calls))  # other files: computed
    assert len(calls) == 4


def test_recently_changed_files_are_not_trusted(tmp_path: Path) -> None:
    path, calls = tmp_path / "a.txt", []
    path.write_text("new")
    os.utime(path, (1, 1))  # an old mtime does not help: ctime says it changed now
    assert settled_signature([path]) is None
    for _ in range(2):
        assert settled_memo(("t",), [path], _reader(path, calls)) == "new"
    assert len(calls) == 2


def test_pycode_fingerprint_is_read_once_while_the_sources_stay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "SETTLED_S", 0.0)
    hashed: list[int] = []
    real = pycode._hash_sources
    monkeypatch.setattr(pycode, "_hash_sources", lambda *a: hashed.append(1) or real(*a))
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "geometry.py").write_text(SOURCE)
    cfg = PycodeConfig(roots=[str(root)], cache_dir=str(tmp_path / "cache"))
    first = load_pycode_pairs(cfg, progress=False)
    again = load_pycode_pairs(cfg, progress=False)
    assert again.pairs == first.pairs and len(hashed) == 1  # the miner reused it too
    assert load_pycode_pairs(cfg, progress=False).pairs == first.pairs
    assert len(hashed) == 1
    _rewrite_keeping_times(root / "geometry.py", SOURCE.replace("circle", "CIRCLE"))
    changed = load_pycode_pairs(cfg, progress=False)
    assert len(hashed) == 2
    assert changed.pairs != first.pairs and "CIRCLE" in changed.pairs[0].doc
    assert changed.provenance["fingerprint"] != first.provenance["fingerprint"]
    (root / "more.py").write_text(SOURCE.replace("area", "size"))
    assert len(load_pycode_pairs(cfg, progress=False).pairs) == 2
