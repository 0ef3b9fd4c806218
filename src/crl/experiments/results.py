"""``results.csv``: one row per finished run, rebuilt from the run directories' files."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from crl.experiments.study import RunSpec
from crl.rundir import SUMMARY_FILE, atomic_write, read_json

RESULTS_FILE = "results.csv"


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


def collect_rows(specs: list[RunSpec], study_dir: Path) -> list[dict[str, Any]]:
    """The rows of every finished run of ``specs`` (those whose ``summary.json`` exists)."""
    rows: list[dict[str, Any]] = []
    for spec in specs:
        summary_path = study_dir / spec.run_id / SUMMARY_FILE
        if not summary_path.exists():
            continue
        summary = flatten(read_json(summary_path))
        # The study's run id names the run directory; a summary's own ``run_id`` (the train
        # config hash) must not replace it.
        rows.append({"run_id": spec.run_id, **spec.tags,
                     **{k: v for k, v in summary.items() if k != "run_id"}})
    return rows


def write_results(rows: list[dict[str, Any]], path: Path, first: list[str]) -> None:
    """Write ``rows`` as CSV atomically; columns ``first`` come first, the rest sorted."""
    columns = [c for c in first if any(c in r for r in rows)]
    rest = sorted({k for r in rows for k in r} - set(columns))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns + rest, extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    data = buffer.getvalue().encode("utf-8")
    atomic_write(path, lambda f: f.write(data))


def _cell(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan"
    return value


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
    return text


def read_results(path: Path) -> list[dict[str, Any]]:
    """Read a ``results.csv`` back, with numbers as numbers and empty cells as None."""
    with open(path, newline="", encoding="utf-8") as handle:
        # Run ids stay strings: a bare hex digest such as "34e00288" would parse as a float.
        return [{k: v if k == "run_id" else _parse(v) for k, v in row.items()}
                for row in csv.DictReader(handle)]
