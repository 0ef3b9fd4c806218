"""pycode's listing of the sources is walked once per process while every directory it walked
stays settled (crl.data.pycode._list_roots): the same files, and any file or directory added,
removed or renamed is seen."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from crl.data import cache, pycode

SOURCE = 'def area(r):\n    """Return the area of a circle of radius r."""\n    return 3 * r * r\n'


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pycode, "_LISTED", {})
    monkeypatch.setattr(cache, "SETTLED_S", 0.0)


def _names(listed: list[list[Path]]) -> list[str]:
    return [p.name for files in listed for p in files]


def _tick() -> None:
    time.sleep(0.05)  # past the file system clock's tick, so a directory's mtime moves


def test_listing_once_while_settled_and_changes_seen(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text(SOURCE)
    (root / "sub" / "b.py").write_text(SOURCE)
    roots = [("pkg", root)]
    walks: list[int] = []
    real = pycode._walk_roots
    monkeypatch.setattr(pycode, "_walk_roots", lambda *a: walks.append(1) or real(*a))
    _tick()
    first = pycode._list_roots(roots, False)
    assert _names(first) == ["a.py", "b.py"]
    first[0].clear()  # a caller's change does not reach the memo
    assert _names(pycode._list_roots(roots, False)) == ["a.py", "b.py"] and len(walks) == 1
    _tick()
    (root / "sub" / "c.py").write_text(SOURCE)  # added deep down
    assert _names(pycode._list_roots(roots, False)) == ["a.py", "b.py", "c.py"]
    _tick()
    (root / "a.py").rename(root / "sub" / "d.py")  # moved
    assert _names(pycode._list_roots(roots, False)) == ["b.py", "c.py", "d.py"]
    _tick()
    (root / "new").mkdir()
    _tick()
    (root / "new" / "e.py").write_text(SOURCE)  # inside a directory added since
    assert _names(pycode._list_roots(roots, False)) == ["e.py", "b.py", "c.py", "d.py"]
    _tick()
    assert _names(pycode._list_roots(roots, False)) == ["e.py", "b.py", "c.py", "d.py"]
    _tick()
    (root / "new" / "e.py").write_text(SOURCE + "\n")  # a change of content: the same names
    walked = len(walks)
    assert _names(pycode._list_roots(roots, False)) == ["e.py", "b.py", "c.py", "d.py"]
    assert len(walks) == walked  # content is the fingerprint's business, not the listing's


def test_a_removed_root_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.py").write_text(SOURCE)
    pycode._list_roots([("pkg", root)], False)
    (root / "a.py").unlink()
    root.rmdir()
    with pytest.raises(pycode.CrlValueError, match="is not a directory"):
        pycode._list_roots([("pkg", root)], False)
