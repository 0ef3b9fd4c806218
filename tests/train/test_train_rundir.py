"""Run-directory files: atomic writes, the JSON-lines reader, checkpoint checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crl import __version__
from crl.errors import CrlError, CrlValueError
from crl.rundir import (
    append_jsonl,
    atomic_write,
    read_json,
    read_jsonl,
    rewrite_jsonl,
    write_json,
)
from crl.rundir.files import as_written, json_text
from crl.train.checkpoint import CHECKPOINT_KEYS, load_checkpoint, save_checkpoint


def test_failed_atomic_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    write_json(target, {"a": 1})

    def broken(handle: object) -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(target, broken)  # type: ignore[arg-type]
    assert read_json(target) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary left


def test_atomic_write_fsyncs_the_directory_after_the_rename(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is fsync'ed before the rename and its directory after it (the rename is durable)."""
    import os
    import stat

    import crl.rundir.files as rundir

    target = tmp_path / "summary.json"
    calls: list[tuple[str, bool]] = []  # (what the descriptor is, whether the target exists yet)
    real = os.fsync

    def spy(fd: int) -> None:
        info = os.fstat(fd)
        is_dir = stat.S_ISDIR(info.st_mode)
        same = is_dir and info.st_ino == os.stat(tmp_path).st_ino
        calls.append(("folder" if same else "dir" if is_dir else "file", target.exists()))
        real(fd)

    monkeypatch.setattr(rundir.os, "fsync", spy)
    write_json(target, {"a": 1})
    assert calls == [("file", False), ("folder", True)]


def test_json_writes_nan_as_null_and_reads_back(tmp_path: Path) -> None:
    write_json(tmp_path / "x.json", {"loss": float("nan"), "nested": {"v": [1.0, float("inf")]}})
    assert read_json(tmp_path / "x.json") == {"loss": None, "nested": {"v": [1.0, None]}}
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(CrlValueError, match="JSON object"):
        read_json(tmp_path / "bad.json")


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(),
                    st.text(max_size=5))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner),
    st.dictionaries(st.text(max_size=4), inner, max_size=4),
    st.dictionaries(st.integers(-5, 5), inner, max_size=3)), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=4), _VALUES, max_size=5))
def test_json_text_reads_back_as_json_dumps_writes(data: dict) -> None:
    """The one-line lists of :func:`json_text` change the layout, not the value: it reads back
    as ``json.dumps(indent=2, sort_keys=True)`` of the cleaned value (NaN/Inf as null)."""
    assert json.loads(json_text(data)) == as_written(data)


def test_json_text_keeps_long_lists_of_numbers_on_one_line() -> None:
    text = json_text({"split": {"test": list(range(4000)), "how": "drawn"}, "x": [{"a": 1}]})
    assert len(text.splitlines()) == 11 and '"test": [0, 1, 2,' in text
    assert json.loads(text)["split"]["test"] == list(range(4000))


def test_jsonl_reader(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert read_jsonl(path) == []
    for step in range(3):
        append_jsonl(path, {"step": step})
    assert [r["step"] for r in read_jsonl(path)] == [0, 1, 2]
    with open(path, "a") as handle:
        handle.write('{"step": 3, "tr')  # torn by a crash
    assert [r["step"] for r in read_jsonl(path)] == [0, 1, 2]
    rewrite_jsonl(path, [{"step": 0}])
    assert path.read_text() == '{"step": 0}\n'
    path.write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(CrlValueError, match="line 2"):
        read_jsonl(path)


def test_checkpoint_round_trip_and_checks(tmp_path: Path) -> None:
    state = dict.fromkeys(CHECKPOINT_KEYS, 0)
    state.update(model={"w": torch.arange(3.0)}, config_hash="abcd1234", crl_version=__version__)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, state)
    loaded = load_checkpoint(path, config_hash="abcd1234")
    assert torch.equal(loaded["model"]["w"], torch.arange(3.0))
    with pytest.raises(CrlError, match="belongs to config abcd1234"):
        load_checkpoint(path, config_hash="ffff0000")
    with pytest.raises(CrlError, match="lacks"):
        save_checkpoint(path, {"model": {}})
    with pytest.raises(CrlError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")
    path.write_bytes(b"garbage")
    with pytest.raises(CrlError, match="truncated or corrupt"):
        load_checkpoint(path)
    torch.save({"model": 1}, path)
    with pytest.raises(CrlError, match="not a crl checkpoint"):
        load_checkpoint(path)
