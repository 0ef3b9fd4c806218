"""``results.csv``: one row per finished run, rebuilt from the run directories' files.

A finished run whose results cannot be read (its ``summary.json`` is not a JSON object, or a
value the study's analysis reads is missing, not a number or not finite) is an
:class:`Unreadable`: listed in the report and left out of the analysis, never dropped without
a word. Cells and column names that a spreadsheet would run as a formula are neutralised
(:func:`csv_cell`).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crl._validation import describe
from crl.experiments.study import RunSpec
from crl.rundir import SUMMARY_FILE, atomic_write, read_json

RESULTS_FILE = "results.csv"
#: What a spreadsheet takes as the start of a formula (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to one level with ``/``-joined keys; lists are kept as JSON-ish strings.

    Example:
        >>> flatten({"test": {"retrieval/x2y_recall@1": 0.5}, "step": 10})
        {'test/retrieval/x2y_recall@1': 0.5, 'step': 10}
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, prefix=f"{name}/"))
        elif isinstance(value, (list, tuple)):
            out[name] = " ".join(str(v) for v in value)
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class Unreadable:
    """A finished run whose results cannot be read, and why.

    Attributes:
        run_id: The run (its directory in the study directory).
        key: The summary value that cannot be read, or ``summary.json`` for the whole file.
        value: What was found (quoted, at most 60 characters), or the file's error.
    """

    run_id: str
    key: str
    value: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready."""
        return {"run_id": self.run_id, "key": self.key, "value": self.value}

    def __str__(self) -> str:
        if self.key == SUMMARY_FILE:
            return f"{self.run_id}/{SUMMARY_FILE}: {self.value}"
        return f"{self.run_id}: {self.key} = {self.value}"


@dataclass
class Results:
    """The rows of a study's finished runs.

    Attributes:
        rows: One per spec whose run finished and whose results can be read.
        written: The rows of every finished run whose summary is a JSON object (what
            ``results.csv`` holds, readable or not).
        unreadable: What could not be read, one entry per run and key.
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    written: list[dict[str, Any]] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def collect_results(specs: Sequence[RunSpec], study_dir: Path,
                    needed: Sequence[str] = ()) -> Results:
    """The rows of every finished run of ``specs`` (those whose ``summary.json`` exists).

    Args:
        specs: The study's runs (specs may share a run id; each gets its own row).
        study_dir: The study directory.
        needed: The summary values every row must hold as finite numbers
            (:meth:`~crl.experiments.study.Study.result_keys`).

    Returns:
        The readable rows, the rows ``results.csv`` holds, and what could not be read.
    """
    out = Results()
    seen: set[str] = set()
    for spec in specs:
        summary_path = study_dir / spec.run_id / SUMMARY_FILE
        if not summary_path.exists():
            continue
        first = spec.run_id not in seen
        seen.add(spec.run_id)
        try:
            summary = flatten(read_json(summary_path))
        except (ValueError, RecursionError) as exc:  # not JSON, not an object, too deep
            if first:
                out.unreadable.append(Unreadable(spec.run_id, SUMMARY_FILE,
                                                 _reason(exc, summary_path)))
            continue
        # The study's run id names the run directory and its tags are the grid's: a summary's
        # own ``run_id`` (the train config hash) or a key of the same name must not replace them.
        row = {**{k: v for k, v in summary.items() if k != "run_id"}, "run_id": spec.run_id,
               **spec.tags}
        out.written.append(row)
        bad = [Unreadable(spec.run_id, key, "missing" if key not in row else describe(row[key]))
               for key in needed if not _number(row.get(key))]
        if not bad:
            out.rows.append(row)
        elif first:
            out.unreadable += bad
    return out


def _reason(exc: BaseException, path: Path) -> str:
    text = str(exc).removeprefix(f"{path}: ").strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def collect_rows(specs: Sequence[RunSpec], study_dir: Path) -> list[dict[str, Any]]:
    """The rows of every finished run of ``specs`` whose ``summary.json`` can be read."""
    return collect_results(specs, study_dir).rows


def _formula_like(text: str) -> bool:
    """Whether a spreadsheet would take ``text`` as a formula (a number is not one), or
    ``text`` is such a cell already neutralised (so that reading it back is exact)."""
    if text.startswith(FORMULA_START):
        return _NUMBER.fullmatch(text) is None
    return text.startswith("'") and _formula_like(text[1:])


def csv_cell(value: Any) -> Any:
    """A value as ``results.csv`` writes it: a string a spreadsheet would run as a formula
    (a leading ``=``, ``+``, ``-``, ``@``, tab or carriage return) gets a leading ``'``;
    numbers, and strings that are numbers such as ``-0.5``, stay as they are; a non-finite
    float is ``nan``. :func:`read_results` undoes it.

    Example:
        >>> csv_cell("=HYPERLINK(1)"), csv_cell("-0.5"), csv_cell(-0.5), csv_cell("shared")
        ("'=HYPERLINK(1)", '-0.5', -0.5, 'shared')
    """
    if isinstance(value, float) and not math.isfinite(value):
        return "nan"
    if isinstance(value, str) and _formula_like(value):
        return "'" + value
    return value


def _uncell(text: str) -> str:
    return text[1:] if text.startswith("'") and _formula_like(text[1:]) else text


def write_results(rows: list[dict[str, Any]], path: Path, first: list[str]) -> None:
    """Write ``rows`` as CSV atomically; columns ``first`` come first, the rest sorted; cells
    and column names neutralised by :func:`csv_cell`."""
    columns = [c for c in first if any(c in r for r in rows)]
    rest = sorted({k for r in rows for k in r} - set(columns))
    names = columns + rest
    lines = [_csv_line([csv_cell(name) for name in names])]
    lines += [_csv_line([csv_cell(row.get(name, "")) for name in names]) for row in rows]
    data = "".join(lines).encode("utf-8")
    atomic_write(path, lambda f: f.write(data))


def _csv_line(cells: list[Any]) -> str:
    """One CSV record ending in ``\n``. It is written with the terminator ``\r\n``, then cut
    to ``\n``, so that a cell holding a carriage return is quoted too (the csv module quotes
    only the characters of its terminator), which a reader would otherwise take for the end
    of the record."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\r\n").writerow(cells)
    return buffer.getvalue()[:-2] + "\n"


def _parse(text: str) -> Any:
    if text == "":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    if text in ("True", "False"):
        return text == "True"
    return _uncell(text)


def read_results(path: Path) -> list[dict[str, Any]]:
    """Read a ``results.csv`` back, with numbers as numbers and empty cells as None (and the
    neutralised cells of :func:`csv_cell` as they were)."""
    with open(path, newline="", encoding="utf-8") as handle:
        # Run ids stay strings: a bare hex digest such as "34e00288" would parse as a float.
        return [{_uncell(k): v if k == "run_id" else _parse(v) for k, v in row.items()}
                for row in csv.DictReader(handle)]
