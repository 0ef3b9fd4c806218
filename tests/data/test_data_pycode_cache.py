"""The pycode cache is keyed on the sources' content, not on where they are installed: two
clones (two virtual environments with the same packages) share one cache file; processes that
need the same missing cache mine it once, under a file lock."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest

from crl.data import PycodeConfig, pycode
from crl.data.cache import prepare_data_caches
from crl.data.pycode import load_pycode_pairs

SOURCE = ('def area(r):\n    """Return the area of a circle of radius r."""\n'
          "    return 3 * r * r\n\n"
          'def side(x):\n    """Return the side of a square of area x."""\n    return x ** 0.5\n')


def _package(root: Path, text: str = SOURCE) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text(text)
    (root / "sub" / "more.py").write_text('def f():\n    """A helper of the package."""\n'
                                          "    return 1\n")
    return root


def _counting(monkeypatch: pytest.MonkeyPatch, log: Path, delay: float = 0.0) -> None:
    """Make ``mine_pairs`` append a line to ``log`` (also from forked processes)."""
    real = pycode.mine_pairs

    def counted(*args: Any, **kwargs: Any) -> pycode.MinedPairs:
        with log.open("a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(delay)
        return real(*args, **kwargs)

    monkeypatch.setattr(pycode, "mine_pairs", counted)
    monkeypatch.setattr(pycode, "_MEMO", {})


def _mined(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_two_clones_share_one_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, cache = tmp_path / "mined.log", tmp_path / "cache"
    _counting(monkeypatch, log)
    clone_a = _package(tmp_path / "clone_a" / ".venv" / "site-packages" / "torch")
    clone_b = _package(tmp_path / "clone_b" / ".venv" / "site-packages" / "torch")
    os.utime(clone_b / "__init__.py", (1, 1))  # installed at another time
    cfg = PycodeConfig(cache_dir=str(cache))  # the default roots
    monkeypatch.setattr(pycode, "default_roots", lambda: [("torch", clone_a)])
    first = load_pycode_pairs(cfg, progress=False)
    monkeypatch.setattr(pycode, "default_roots", lambda: [("torch", clone_b)])
    monkeypatch.setattr(pycode, "_MEMO", {})
    second = load_pycode_pairs(cfg, progress=False)
    assert _mined(log) == 1 and second.pairs == first.pairs and len(first.pairs) == 3
    assert len(list((cache / "pycode").glob("*.jsonl"))) == 1
    assert second.provenance["roots"] == {"torch": str(clone_b)}  # this clone's, not the writer's
    assert str(tmp_path) not in Path(first.provenance["cache"]).name


def test_content_change_is_a_new_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "mined.log"
    _counting(monkeypatch, log)
    root = _package(tmp_path / "pkg")
    cfg = PycodeConfig(roots=[str(root)], cache_dir=str(tmp_path / "cache"))
    first = load_pycode_pairs(cfg, progress=False)
    # Same size, same mtime, other bytes: only a content key sees it.
    stat = (root / "__init__.py").stat()
    (root / "__init__.py").write_text(SOURCE.replace("circle", "CIRCLE"))
    os.utime(root / "__init__.py", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = load_pycode_pairs(cfg, progress=False)
    assert _mined(log) == 2 and second.pairs != first.pairs
    assert first.provenance["fingerprint"]["sha256"] != second.provenance["fingerprint"]["sha256"]


def _load_in_child(cfg: PycodeConfig) -> None:
    load_pycode_pairs(cfg, progress=False)


def test_processes_started_together_mine_once(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "mined.log"
    _counting(monkeypatch, log, delay=0.5)  # the first miner holds the lock half a second
    root = _package(tmp_path / "pkg")
    cfg = PycodeConfig(roots=[str(root)], cache_dir=str(tmp_path / "cache"))
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=_load_in_child, args=(cfg,)) for _ in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
    assert [child.exitcode for child in children] == [0, 0, 0]
    assert _mined(log) == 1
    assert not list((tmp_path / "cache" / "pycode").glob("*.tmp"))


def test_prepare_data_caches_mines_each_distinct_config_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "mined.log"
    _counting(monkeypatch, log)
    root = _package(tmp_path / "pkg")
    data = {"name": "pycode", "pycode": {"roots": [str(root)], "cache_dir": str(tmp_path)}}
    configs = [data, data, {"name": "digits"}, {"name": "pycode", "pycode": {"bogus": 1}}]
    assert prepare_data_caches(configs, progress=False) == 1
    assert _mined(log) == 1
    monkeypatch.setattr(pycode, "_MEMO", {})
    load_pycode_pairs(PycodeConfig(roots=[str(root)], cache_dir=str(tmp_path)), progress=False)
    assert _mined(log) == 1  # a worker now reads the cache
