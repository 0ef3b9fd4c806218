"""Damaged run and study directories, generated (issue 27, goal 2): hypothesis mutates one file
of a finished run directory (``config.json``, ``summary.json``, ``metrics.jsonl``,
``checkpoint.pt``) or of a finished study directory (``study.json`` and a run's files), then
runs ``crl eval``, ``crl report`` or the same ``crl study`` again, in-process.

Each draw must end with exit code 0 or 2 (never an uncaught exception), a refusal must be one
``error:`` line, nothing outside the copied directory may change (a sibling sentinel directory is
hashed before and after) and no code may run: ``evilmod.py`` lies on ``sys.path`` and would create
``MARKER`` if a planted ``model.factory`` were imported.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_robustness_security import EVIL_MODULE, MARKER, STUDY, _tree, study, trained
from typer.testing import CliRunner

from crl.cli import app

__all__ = ["study", "trained"]  # the module-scoped fixtures, shared with the security tests

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
DEEP = "\x00deep\x00"  # stands for arrays nested 100,000 deep in the written JSON
Mutation = Callable[[bytes], bytes]


@pytest.fixture(scope="module")
def evil_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory on ``sys.path`` holding ``evilmod.py`` (imported, it creates MARKER)."""
    folder = tmp_path_factory.mktemp("evil")
    (folder / "evilmod.py").write_text(EVIL_MODULE)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    sys.modules.pop("evilmod", None)


# ----------------------------------------------------------------------------- mutations

JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["=cmd|' /C calc'!A0", "+1", "@SUM(A1)", "custom", "evilmod:build"]),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(),
                                                         max_size=2),
    st.just(DEEP))


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value`` (the document itself is ``()``)."""
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


def _dumps(value: Any) -> bytes:
    text = json.dumps(value)  # NaN, Infinity and 10**400 written as Python's json writes them
    return text.replace(json.dumps(DEEP), "[" * 100_000 + "]" * 100_000).encode()


@st.composite
def json_edit(draw: st.DrawFn, document: Any) -> Mutation:
    """Replace one value of ``document`` by another JSON value, remove a key, or add one."""
    path = draw(st.sampled_from(_paths(document)))
    action = draw(st.sampled_from(["replace", "remove", "add"]))
    new_value = draw(JSON_VALUES)
    new_key = draw(st.sampled_from(["=formula", "colour", "", "model", "recall@1"]))

    def edit(_: bytes) -> bytes:
        doc = json.loads(json.dumps(document))
        if not path:
            return _dumps(new_value)
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        if action == "replace":
            parent[path[-1]] = new_value
        elif action == "remove":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[new_key] = new_value
        else:
            parent.append(new_value)
        return _dumps(doc)
    return edit


def _planted_factory(data: bytes) -> bytes:
    doc = json.loads(data)
    config = doc.get("config", doc)
    config.setdefault("model", {}).update(kind="custom", factory="evilmod:build")
    return json.dumps(doc).encode()


@st.composite
def raw_edit(draw: st.DrawFn, size: int) -> Mutation:
    """Random bytes, a cut at a random offset, or flipped bytes."""
    kind = draw(st.sampled_from(["bytes", "truncate", "flip"]))
    noise = draw(st.binary(max_size=64))
    offset = draw(st.integers(0, max(size - 1, 0)))
    if kind == "bytes":
        return lambda _: noise
    if kind == "truncate":
        return lambda data: data[:offset]
    return lambda data: data[:offset] + bytes(b ^ 0xFF for b in data[offset:offset + 8]) + \
        data[offset + 8:]


@st.composite
def mutation(draw: st.DrawFn, folder: Path, names: list[str]) -> tuple[str, Mutation]:
    """``(file, edit)``: one file below ``folder`` and what to do to its bytes."""
    name = draw(st.sampled_from(names))
    data = (folder / name).read_bytes()
    if name.endswith(".pt"):
        return name, draw(raw_edit(len(data)))
    if name.endswith(".jsonl"):
        lines = data.decode().splitlines(keepends=True)
        index = draw(st.integers(0, len(lines) - 1))
        line = lines[index]
        line_edit = draw(st.one_of(json_edit(json.loads(line)), raw_edit(len(line))))
        return name, lambda _: b"".join([*(x.encode() for x in lines[:index]),
                                         line_edit(line.encode()).rstrip(b"\n") + b"\n",
                                         *(x.encode() for x in lines[index + 1:])])
    choices = [json_edit(json.loads(data)), raw_edit(len(data))]
    if name.endswith(("config.json", "spec.json")):
        choices.append(st.just(_planted_factory))
    return name, draw(st.one_of(*choices))


# ----------------------------------------------------------------------------- the check


def _check(source: Path, name: str, edit: Mutation, evil: Path,
           command: Callable[[Path], list[str]]) -> None:
    """Copy ``source``, apply ``edit`` to its file ``name``, run ``command(copy)`` and check."""
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        work = tmp / "work" / source.name
        shutil.copytree(source, work)
        sentinel = tmp / "sentinel"
        shutil.copytree(source, sentinel)  # what a write outside the copy would hit
        (work / name).write_bytes(edit((work / name).read_bytes()))
        before = _tree(sentinel)
        result = CliRunner().invoke(app, command(work))
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            result.output, result.exc_info)
        assert result.exit_code in (0, 2), result.output
        if result.exit_code == 2:
            lines = result.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert "Traceback" not in result.output
        assert _tree(sentinel) == before, "a file outside the directory changed"
        assert sorted(p.name for p in tmp.iterdir()) == ["sentinel", "work"]
        assert not (evil / MARKER).exists(), "a planted factory was imported"


RUN_FILES = ["config.json", "summary.json", "metrics.jsonl", "checkpoint.pt"]


@pytest.fixture(scope="module")
def study_dir(study: Path) -> Path:
    return study / "negatives"


def _study_files(study_dir: Path) -> list[str]:
    run = sorted(p.parent.name for p in study_dir.glob("*/summary.json"))[0]
    return ["study.json", *(f"{run}/{n}" for n in [*RUN_FILES, "spec.json"])]


@given(data=st.data())
@SETTINGS
def test_crl_eval_on_a_damaged_run_directory(trained: Path, evil_dir: Path,
                                             data: st.DataObject) -> None:
    name, edit = data.draw(mutation(trained, RUN_FILES))
    _check(trained, name, edit, evil_dir, lambda run: ["eval", str(run)])


@given(data=st.data())
@SETTINGS
def test_crl_report_on_a_damaged_study_directory(study_dir: Path, evil_dir: Path,
                                                 data: st.DataObject) -> None:
    name, edit = data.draw(mutation(study_dir, _study_files(study_dir)))
    _check(study_dir, name, edit, evil_dir, lambda folder: ["report", str(folder)])


@given(data=st.data())
@settings(SETTINGS, max_examples=6)
def test_a_study_rerun_on_a_damaged_study_directory(study_dir: Path, evil_dir: Path,
                                                    data: st.DataObject) -> None:
    name, edit = data.draw(mutation(study_dir, _study_files(study_dir)))
    _check(study_dir, name, edit, evil_dir, lambda folder: [*STUDY, "--out", str(folder.parent)])


def test_the_mutations_reach_every_kind_of_damage() -> None:
    """The strategies can produce what the issue lists (so the fuzz is not vacuous)."""
    doc = {"a": [1, {"b": 2.0}]}
    assert json.loads(_dumps({"x": math.nan}))["x"] != json.loads(_dumps({"x": math.nan}))["x"]
    assert _dumps({"x": DEEP}).count(b"[") == 100_000
    assert set(map(len, _paths(doc))) == {0, 1, 2, 3}
    planted = json.loads(_planted_factory(json.dumps({"config": {"model": {"kind": "mlp"}}})
                                          .encode()))
    assert planted["config"]["model"] == {"kind": "custom", "factory": "evilmod:build"}
