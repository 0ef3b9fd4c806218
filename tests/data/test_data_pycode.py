"""pycode mining on small hand-written sources: extraction, filters, dedup, skips, cache."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

import crl.data.pycode as pycode
from crl.data import DataConfig, PycodeConfig, load_data
from crl.data.pycode import (
    extract_pairs,
    first_paragraph,
    is_trivial_doc,
    load_pycode_pairs,
    mine_pairs,
)
from crl.errors import CrlValueError

MODULE = textwrap.dedent('''
    """Module docstring, not a function."""

    import math


    def area(radius):
        """Compute the area of a circle.

        Longer explanation that is not part of view a.
        """
        # a comment stays
        return math.pi * radius ** 2


    class Shape:
        @property
        def sides(self):
            """Number of sides of the shape."""
            return self._sides

        async def fetch(self, url):
            """Fetch the shape from a url."""
            return await get(url)

        def todo(self):
            """TODO: describe this."""
            return 1

        def short(self):
            """Short doc."""
            return 2

        def stub(self):
            """An abstract method that subclasses implement."""
            raise NotImplementedError

        def nodoc(self):
            return 3


    def one_line(x): """Return x plus one for testing."""; return x + 1
''')


def _write(root: Path, rel: str, text: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_extract_pairs_docstring_code_and_filters() -> None:
    pairs = extract_pairs(MODULE, "m.py")
    docs = [p.doc for p in pairs]
    assert docs == ["Compute the area of a circle.", "Number of sides of the shape.",
                    "Fetch the shape from a url.", "Return x plus one for testing."]
    area = pairs[0]
    assert area.code == ("def area(radius):\n    # a comment stays\n"
                         "    return math.pi * radius ** 2")
    assert area.source == "m.py:7"
    assert pairs[1].code == "def sides(self):\n    return self._sides"  # decorator and indent gone
    assert pairs[2].code.startswith("async def fetch(self, url):")
    assert "Return x plus one" not in pairs[3].code and "return x + 1" in pairs[3].code


def test_code_is_cut_to_max_chars() -> None:
    src = 'def f():\n    """Return a long list of numbers."""\n    return [' + "1, " * 500 + "]\n"
    (pair,) = extract_pairs(src, "f.py", max_code_chars=100)
    assert len(pair.code) == 100 and pair.code.startswith("def f():\n    return [1, ")


def test_first_paragraph_and_trivial_docs() -> None:
    assert first_paragraph("  One  two\nthree.\n   \nFour.") == "One two three."
    for doc in ("Two words", "TODO fix this later", "Alias for numpy.sum function",
                "Deprecated since version 2", "See the other function"):
        assert is_trivial_doc(doc)
    assert not is_trivial_doc("Return the sum of the values.")
    assert is_trivial_doc("Return the sum.", min_words=4)


def test_mining_dedups_skips_and_orders(tmp_path: Path) -> None:
    _write(tmp_path, "b/mod.py", MODULE)
    _write(tmp_path, "a/first.py", 'def g(x):\n    """Compute the area of a circle."""\n'
                                   "    return 2 * x\n")  # same doc as area(): kept here only
    _write(tmp_path, "c/copy.py", 'def g(x):\n    """A different summary line here."""\n'
                                  "    return 2 * x\n")  # same code as g(): dropped
    _write(tmp_path, "c/broken.py", "def oops(:\n")
    _write(tmp_path, "c/latin.py", b"def f():\n    '''\xff\xfe bad bytes here'''\n")
    _write(tmp_path, "tests/test_x.py", 'def t():\n    """Check that things work well."""\n'
                                        "    assert True\n")
    _write(tmp_path, "c/__pycache__/x.py", 'def z():\n    """Never read from caches."""\n'
                                           "    return 0\n")
    mined = mine_pairs([("tmp", tmp_path)])
    sources = [p.source for p in mined.pairs]
    assert sources[0] == "tmp/a/first.py:1"
    assert sources == sorted(sources, key=lambda s: (s.split(":")[0], int(s.split(":")[1])))
    docs = [p.doc.lower() for p in mined.pairs]
    assert len(docs) == len(set(docs)) == 4
    assert "a different summary line here." not in docs
    assert mined.provenance["skipped_files"] == 2
    assert mined.provenance["files"] == 5
    assert mined.provenance["pairs_before_dedup"] == 6
    with_tests = mine_pairs([("tmp", tmp_path)], include_tests=True)
    assert "check that things work well." in [p.doc.lower() for p in with_tests.pairs]


def test_empty_or_missing_root_is_an_error(tmp_path: Path) -> None:
    _write(tmp_path, "empty/readme.txt", "no python here")
    with pytest.raises(CrlValueError, match=r"empty.*no Python"):
        mine_pairs([("e", tmp_path / "empty")])
    with pytest.raises(CrlValueError, match="not a directory"):
        load_pycode_pairs(PycodeConfig(roots=[str(tmp_path / "absent")], cache_dir=str(tmp_path)))


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = pycode.mine_pairs

    def counted(*args: object, **kwargs: object) -> pycode.MinedPairs:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pycode, "mine_pairs", counted)
    return calls


def test_cache_is_reused_and_rebuilt_when_roots_or_files_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    root1, root2, cache = tmp_path / "r1", tmp_path / "r2", tmp_path / "cache"
    _write(root1, "m.py", MODULE)
    _write(root2, "n.py", 'def k(v):\n    """Return the value doubled again."""\n    return 2*v\n')
    cfg = PycodeConfig(roots=[str(root1)], cache_dir=str(cache))
    first = load_pycode_pairs(cfg, progress=False)
    second = load_pycode_pairs(cfg, progress=False)
    assert len(calls) == 1 and second.pairs == first.pairs
    assert Path(second.provenance["cache"]).is_file()
    assert second.provenance["roots"] == {str(root1.resolve()): str(root1.resolve())}
    both = load_pycode_pairs(cfg.model_copy(update={"roots": [str(root1), str(root2)]}),
                             progress=False)
    assert len(calls) == 2 and len(both.pairs) == len(first.pairs) + 1
    _write(root1, "extra.py", 'def e():\n    """Yet another function to mine."""\n    return 5\n')
    third = load_pycode_pairs(cfg, progress=False)
    assert len(calls) == 3 and len(third.pairs) == len(first.pairs) + 1
    header, *rest = Path(third.provenance["cache"]).read_text().splitlines()
    Path(third.provenance["cache"]).write_text("\n".join([header, *rest[:-1]]) + "\n")
    fourth = load_pycode_pairs(cfg, progress=False)  # a truncated cache is rebuilt
    assert len(calls) == 4 and fourth.pairs == third.pairs


def test_cache_records_versions_and_is_rebuilt_when_they_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    _write(tmp_path / "r", "m.py", MODULE)
    cfg = PycodeConfig(roots=[str(tmp_path / "r")], cache_dir=str(tmp_path / "c"))
    mined = load_pycode_pairs(cfg, progress=False)
    assert mined.provenance["versions"]["python"]
    monkeypatch.setattr(pycode.platform, "python_version", lambda: "0.0.0")
    load_pycode_pairs(cfg, progress=False)
    assert len(calls) == 2


def test_load_data_pycode_splits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "src"
    for i in range(30):
        _write(root, f"m{i:02d}.py",
               f'def f{i}(x):\n    """Return x times {i} for the test number {i}."""\n'
               f"    return x * {i}\n")
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    cfg = DataConfig(name="pycode", pycode={"roots": [str(root)]})
    splits = load_data(cfg, progress=False)
    assert os.path.isdir(tmp_path / "cache" / "pycode")
    assert (len(splits.train), len(splits.val), len(splits.test)) == (21, 3, 6)
    assert splits.info.kind == "text" and splits.train.is_text
    doc, code, index, label = splits.test[0]
    assert isinstance(doc, str) and code.startswith("def f") and (index, label) == (0, -1)
    docs = [set(getattr(splits, n).eval_views()[0]) for n in ("train", "val", "test")]
    assert not (docs[0] & docs[2]) and not (docs[0] & docs[1]) and not (docs[1] & docs[2])
    assert splits.test.eval_views() == load_data(cfg, progress=False).test.eval_views()
