"""Docstring-to-code pairs mined from the Python sources installed on this machine.

View a is the first paragraph of a function's docstring, view b the function's code without its
docstring (from the ``def`` line, decorators excluded, cut to ``max_code_chars``). Pairs are mined
with :mod:`ast` in a deterministic order (root, path, line), deduplicated by content (a pair whose
docstring, compared case-insensitively, or whose code was already seen is dropped, so no docstring
can land in two splits), and cached on disk under a key made of the sources' content: a SHA-256
of every mined file (its path relative to its root, its bytes), the Python and package versions,
the options, and each root's label (the package name for the default roots, not where the
virtual environment lives), so two clones of crl with the same packages share one cache file.
A cache whose record differs is rebuilt; mining runs under a file lock, so processes that need
the same missing cache (a study's workers, two studies started together) mine it once.

Dropped as trivial: first paragraphs with fewer than ``min_doc_words`` words or starting with
"TODO", "FIXME", "XXX", "Alias for", "See ", "Same as" or "Deprecated", and functions whose body
is only the docstring, ``pass``, ``...`` or ``raise NotImplementedError``.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import sysconfig
import textwrap
import time
import tokenize
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crl.data.cache import locked, resolve_cache_dir, settled_memo, settled_signature
from crl.data.config import PycodeConfig
from crl.errors import CrlValueError
from crl.rundir import atomic_write

#: Bump when the mining rules change, so old caches are rebuilt.
FORMAT_VERSION = 1

#: Import name -> distribution name of the packages mined by default (crl's own dependencies).
DEFAULT_PACKAGES = {"torch": "torch", "numpy": "numpy", "scipy": "scipy",
                    "sklearn": "scikit-learn"}

_SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages"}
_TEST_DIRS = {"test", "tests", "idle_test"}
_TRIVIAL_PREFIXES = ("todo", "fixme", "xxx", "alias for", "see ", "same as", "deprecated")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


@dataclass(frozen=True)
class CodePair:
    """One mined pair: ``doc`` (view a), ``code`` (view b) and ``source`` (``root/path:line``)."""

    doc: str
    code: str
    source: str


@dataclass
class MinedPairs:
    """The mined pairs, in deterministic order, and where they came from."""

    pairs: list[CodePair]
    provenance: dict[str, Any] = field(default_factory=dict)


def default_roots() -> list[tuple[str, Path]]:
    """``(label, directory)`` of the standard library and the installed torch, numpy, scipy and
    scikit-learn packages (located without importing them; missing ones are left out)."""
    roots = [("stdlib", Path(sysconfig.get_paths()["stdlib"]))]
    for module in DEFAULT_PACKAGES:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations:
            roots.append((module, Path(next(iter(spec.submodule_search_locations)))))
    return roots


def _versions(labels: list[str]) -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for label in labels:
        if label in DEFAULT_PACKAGES:
            try:
                versions[label] = importlib.metadata.version(DEFAULT_PACKAGES[label])
            except importlib.metadata.PackageNotFoundError:
                versions[label] = None
    return versions


def python_files(root: Path, include_tests: bool = False,
                 walked: list[Path] | None = None) -> Iterator[Path]:
    """The ``.py`` files under ``root`` in sorted order, skipping caches, nested site-packages,
    hidden directories and (unless ``include_tests``) test directories and ``test_*.py`` files;
    each directory walked is appended to ``walked`` (when given)."""
    for dirpath, dirnames, filenames in os.walk(root):
        if walked is not None:
            walked.append(Path(dirpath))
        dirnames[:] = sorted(
            d for d in dirnames
            if d not in _SKIP_DIRS and not d.startswith(".")
            and (include_tests or d not in _TEST_DIRS)
        )
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            if not include_tests and (name.startswith("test_") or name.endswith("_test.py")
                                      or name == "conftest.py"):
                continue
            yield Path(dirpath) / name


def first_paragraph(docstring: str) -> str:
    """The first paragraph of a (cleaned) docstring on one line, whitespace collapsed.

    Example:
        >>> first_paragraph("Add two\\n  numbers.\\n\\nMore text.")
        'Add two numbers.'
    """
    return " ".join(_PARAGRAPH_BREAK.split(docstring.strip(), maxsplit=1)[0].split())


def is_trivial_doc(text: str, min_words: int = 3) -> bool:
    """True for first paragraphs that say nothing about the code (see the module docstring).

    Example:
        >>> is_trivial_doc("TODO: write this"), is_trivial_doc("Return the sum of x and y.")
        (True, False)
    """
    return len(text.split()) < min_words or text.lower().startswith(_TRIVIAL_PREFIXES)


def _is_stub(body: list[ast.stmt]) -> bool:
    if not body:
        return True
    if len(body) > 1:
        return False
    stmt = body[0]
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return True
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False


def _code_without_docstring(node: ast.FunctionDef | ast.AsyncFunctionDef,
                            lines: list[str]) -> str:
    doc = node.body[0]
    end = node.end_lineno or node.lineno
    before = lines[doc.lineno - 1][:doc.col_offset]
    after = lines[(doc.end_lineno or doc.lineno) - 1][doc.end_col_offset or 0:]
    if doc.lineno > node.lineno and not before.strip() and not after.strip():
        kept = lines[node.lineno - 1:doc.lineno - 1] + lines[(doc.end_lineno or doc.lineno):end]
        return textwrap.dedent("\n".join(kept)).strip("\n")
    # Docstring on the def line or sharing a line with code: rebuild the function from the AST.
    clone = copy.copy(node)
    clone.body = node.body[1:]
    clone.decorator_list = []
    return ast.unparse(clone)


def extract_pairs(source: str, where: str, *, min_doc_words: int = 3,
                  max_code_chars: int = 2000) -> list[CodePair]:
    """The (docstring, code) pairs of every function and method in ``source``, in line order.

    Args:
        source: Python source text.
        where: Label of the file, used in ``CodePair.source``.
        min_doc_words: Shorter first paragraphs are dropped as trivial.
        max_code_chars: Code is cut to this many characters.

    Raises:
        SyntaxError, ValueError: if ``source`` does not parse.

    Example:
        >>> doc = '    \"\"\"Add two numbers.\\n\\n    Long text.\"\"\"\\n'
        >>> src = 'def add(x, y):\\n' + doc + '    return x + y\\n'
        >>> pair = extract_pairs(src, "m.py")[0]
        >>> pair.doc, pair.code, pair.source
        ('Add two numbers.', 'def add(x, y):\\n    return x + y', 'm.py:1')
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = ast.parse(source)
    lines = source.splitlines()
    pairs = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        docstring = ast.get_docstring(node, clean=True)
        if not docstring or _is_stub(node.body[1:]):
            continue
        doc = first_paragraph(docstring)
        if is_trivial_doc(doc, min_doc_words):
            continue
        code = _code_without_docstring(node, lines)[:max_code_chars]
        pairs.append((node.lineno, CodePair(doc, code, f"{where}:{node.lineno}")))
    pairs.sort(key=lambda item: item[0])
    return [pair for _, pair in pairs]


def _read_source(path: Path) -> str:
    with tokenize.open(path) as f:  # honours PEP 263 encoding declarations
        return f.read()


def _fingerprint(roots: list[tuple[str, Path]], listed: list[list[Path]]) -> dict[str, Any]:
    """File count, total size and a SHA-256 of the sources' content: each file's path relative
    to its root and its bytes (about 0.2 s for the 80 MB of the default roots). Nothing about
    where the roots are, or when the files were written, enters it. Read once per process
    while the files stay as they were (:func:`~crl.data.cache.settled_memo`)."""
    files = [path for group in listed for path in group]
    return dict(settled_memo(("pycode", *roots), files, lambda: _hash_sources(roots, listed)))


def _hash_sources(roots: list[tuple[str, Path]], listed: list[list[Path]]) -> dict[str, Any]:
    digest = hashlib.sha256()
    count = size = 0
    for (label, root), files in zip(roots, listed, strict=True):
        digest.update(f"root {label}\0".encode())
        for path in files:
            data = path.read_bytes()
            digest.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
            digest.update(data)
            count += 1
            size += len(data)
    return {"files": count, "bytes": size, "sha256": digest.hexdigest()}


#: The last listing of each ``(roots, include_tests)``: the directories walked, their
#: :func:`~crl.data.cache.settled_signature` and the files found.
_LISTED: dict[tuple[Any, ...], tuple[list[Path], Any, list[list[Path]]]] = {}


def _list_roots(roots: list[tuple[str, Path]], include_tests: bool) -> list[list[Path]]:
    """The ``.py`` files of each root (:func:`python_files`), or this process's last listing of
    the same roots while every directory it walked is settled and has the same signature (an
    entry added, removed or renamed changes its directory's ``mtime``; a study builds a run's
    data many times in one worker, and listing 4,000 files costs about 0.25 s)."""
    key = (tuple((label, str(root)) for label, root in roots), include_tests)
    last = _LISTED.get(key)
    if last is not None and last[1] is not None and _signature(last[0]) == last[1]:
        return [list(files) for files in last[2]]
    walked: list[Path] = []
    listed = _walk_roots(roots, include_tests, walked)
    _LISTED[key] = (walked, _signature(walked), [list(files) for files in listed])
    return listed


def _signature(directories: list[Path]) -> Any:
    """:func:`~crl.data.cache.settled_signature` of the directories; None when one is gone."""
    try:
        return settled_signature(directories)
    except OSError:
        return None


def _walk_roots(roots: list[tuple[str, Path]], include_tests: bool,
                walked: list[Path]) -> list[list[Path]]:
    listed = []
    for label, root in roots:
        if not root.is_dir():
            raise CrlValueError(f"pycode: root {str(root)!r} ({label}) is not a directory")
        files = list(python_files(root, include_tests, walked))
        if not files:
            raise CrlValueError(
                f"pycode: root {str(root)!r} ({label}) holds no Python (.py) files"
                + ("" if include_tests else " outside test directories")
            )
        listed.append(files)
    return listed


def mine_pairs(roots: list[tuple[str, Path]], *, include_tests: bool = False,
               min_doc_words: int = 3, max_code_chars: int = 2000,
               progress: bool = False) -> MinedPairs:
    """Mine and deduplicate the pairs of every ``.py`` file under ``roots`` (no cache).

    Unreadable or unparsable files are skipped and counted in ``provenance["skipped_files"]``.

    Args:
        roots: ``(label, directory)`` pairs; the label prefixes each pair's ``source``.
        include_tests, min_doc_words, max_code_chars: As in :class:`PycodeConfig`.
        progress: Show a progress bar over files.

    Raises:
        CrlValueError: if a root is not a directory or holds no Python files.
    """
    start = time.perf_counter()
    listed = _list_roots(roots, include_tests)
    total = sum(len(files) for files in listed)
    seen_docs: set[str] = set()
    seen_code: set[str] = set()
    kept: list[CodePair] = []
    found = skipped = 0
    from rich.progress import Progress

    with Progress(transient=True, disable=not progress) as bar:
        task = bar.add_task("mining docstring-code pairs", total=total)
        for (label, root), files in zip(roots, listed, strict=True):
            for path in files:
                bar.advance(task)
                where = f"{label}/{path.relative_to(root).as_posix()}"
                try:
                    pairs = extract_pairs(_read_source(path), where, min_doc_words=min_doc_words,
                                          max_code_chars=max_code_chars)
                except (OSError, SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
                    skipped += 1
                    continue
                found += len(pairs)
                for pair in pairs:
                    doc_key = pair.doc.lower()
                    if doc_key in seen_docs or pair.code in seen_code:
                        continue
                    seen_docs.add(doc_key)
                    seen_code.add(pair.code)
                    kept.append(pair)
    provenance = {
        "format": FORMAT_VERSION,
        "roots": {label: str(root) for label, root in roots},
        "versions": _versions([label for label, _ in roots]),
        "fingerprint": _fingerprint(roots, listed),
        "options": {"include_tests": include_tests, "min_doc_words": min_doc_words,
                    "max_code_chars": max_code_chars},
        "files": total,
        "skipped_files": skipped,
        "pairs_before_dedup": found,
        "pairs": len(kept),
        "mining_seconds": round(time.perf_counter() - start, 2),
    }
    return MinedPairs(kept, provenance)


def _resolve_roots(cfg: PycodeConfig) -> list[tuple[str, Path]]:
    if cfg.roots is None:
        return default_roots()
    if not cfg.roots:
        raise CrlValueError("pycode: `roots` must list at least one directory; got []")
    return [(str(Path(r).expanduser().resolve()), Path(r).expanduser().resolve())
            for r in cfg.roots]


def _cache_file(cfg: PycodeConfig, expected: dict[str, Any]) -> Path:
    """``<cache_dir>/pycode/pairs-<hash of the content key>.jsonl``."""
    digest = hashlib.sha256(json.dumps(expected, sort_keys=True).encode()).hexdigest()[:16]
    return resolve_cache_dir(cfg.cache_dir) / "pycode" / f"pairs-{digest}.jsonl"


def _read_cache(path: Path, expected: dict[str, Any]) -> MinedPairs | None:
    if not path.is_file():
        return None
    try:
        with path.open(encoding="utf-8") as f:
            header = json.loads(f.readline())
            if any(header.get(k) != v for k, v in expected.items()):
                return None
            pairs = [CodePair(**json.loads(line)) for line in f]
    except (OSError, ValueError, TypeError):
        return None
    if len(pairs) != header.get("pairs"):
        return None  # a truncated file
    return MinedPairs(pairs, header)


def _write_cache(path: Path, mined: MinedPairs) -> None:
    lines = [json.dumps(mined.provenance)]
    lines += [json.dumps({"doc": p.doc, "code": p.code, "source": p.source}) for p in mined.pairs]
    text = "\n".join(lines) + "\n"
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


#: The pairs last read from the disk cache in this process, keyed by file and content key.
_MEMO: dict[tuple[str, str], MinedPairs] = {}


def load_pycode_pairs(cfg: PycodeConfig, progress: bool = True) -> MinedPairs:
    """The mined pairs for ``cfg``, from the cache when it matches, else mined and cached.

    The cache file (``<cache_dir>/pycode/pairs-<key hash>.jsonl``: a header line with the
    provenance, then one pair per line) is named by a hash of the format, the roots' labels, the
    Python and package versions, the options and the content fingerprint, and is used only when
    its header records the same. A missing cache is mined under an exclusive lock on
    ``pairs-<key hash>.lock``; a process that waited for the lock reads what the holder wrote.

    Raises:
        CrlValueError: if a root is not a directory or holds no Python files.
    """
    roots = _resolve_roots(cfg)
    listed = _list_roots(roots, cfg.include_tests)
    expected = {
        "format": FORMAT_VERSION,
        "labels": [label for label, _ in roots],
        "versions": _versions([label for label, _ in roots]),
        "fingerprint": _fingerprint(roots, listed),
        "options": {"include_tests": cfg.include_tests, "min_doc_words": cfg.min_doc_words,
                    "max_code_chars": cfg.max_code_chars},
    }
    path = _cache_file(cfg, expected)
    memo_key = (str(path), json.dumps(expected, sort_keys=True))
    if memo_key in _MEMO:  # a study runs many configs in one worker process
        return _MEMO[memo_key]
    cached = _read_cache(path, expected)
    if cached is None:
        with locked(path.with_suffix(".lock")):
            cached = _read_cache(path, expected)  # written while this process waited
            if cached is None:
                mined = mine_pairs(roots, include_tests=cfg.include_tests,
                                   min_doc_words=cfg.min_doc_words,
                                   max_code_chars=cfg.max_code_chars, progress=progress)
                mined.provenance["labels"] = expected["labels"]
                _write_cache(path, mined)
                mined.provenance["cache"] = str(path)
                return mined
    # The roots of this installation, not of the process that wrote the cache.
    cached.provenance["roots"] = {label: str(root) for label, root in roots}
    cached.provenance["cache"] = str(path)
    _MEMO.clear()
    _MEMO[memo_key] = cached
    return cached
