"""Read a user's table of texts: ``.jsonl``, ``.csv``/``.tsv``, ``.parquet``, or a directory
written by Hugging Face ``datasets``' ``save_to_disk``, into named columns of Python values.

Every reader returns a :class:`Table` that knows how to name a row in an error message (the
line of a text file, the 0-based row index of a columnar file). Nothing is downloaded.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl.errors import CrlValueError

#: Suffixes of table files, and the marker files of a ``save_to_disk`` directory.
TABLE_SUFFIXES = (".jsonl", ".csv", ".tsv", ".parquet")
_HF_STATE = "state.json"
_HF_DICT = "dataset_dict.json"


@dataclass(frozen=True)
class Table:
    """Columns of equal length read from one file or directory.

    Attributes:
        path: Where the table came from.
        columns: Column name -> its cells (``None`` where a row has no value).
        row_names: How each row is named in messages (``"line 4"``, ``"row 3"``).
    """

    path: Path
    columns: dict[str, list[Any]]
    row_names: list[str]

    def __len__(self) -> int:
        return len(self.row_names)

    def where(self, i: int, column: str | None = None) -> str:
        """``files: PATH, line 4, column 'query'``: the place of a cell for an error message."""
        out = f"files: {self.path}, {self.row_names[i]}"
        return out if column is None else f"{out}, column {column!r}"


def _read_jsonl(path: Path) -> Table:
    records: list[dict[str, Any]] = []
    names: list[str] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CrlValueError(
                    f"files: {path}, line {lineno} is not valid JSON ({exc.msg})"
                ) from None
            if not isinstance(record, dict):
                raise CrlValueError(
                    f"files: {path}, line {lineno} must be a JSON object (one pair per line); "
                    f"got {type(record).__name__}"
                )
            records.append(record)
            names.append(f"line {lineno}")
    keys: dict[str, None] = {}
    for record in records:
        keys.update(dict.fromkeys(record))
    columns = {key: [r.get(key) for r in records] for key in keys}
    return Table(path, columns, names)


def _read_csv(path: Path) -> Table:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        header = next(reader, None)
        if header is None or not any(h.strip() for h in header):
            raise CrlValueError(f"files: {path} has no header line (expected column names)")
        header = [h.strip() for h in header]
        columns: dict[str, list[Any]] = {h: [] for h in header}
        names: list[str] = []
        for row in reader:
            if not row or not any(cell.strip() for cell in row):
                continue  # a blank line
            if len(row) != len(header):
                raise CrlValueError(
                    f"files: {path}, line {reader.line_num} has {len(row)} field(s) but the "
                    f"header has {len(header)} ({', '.join(header)})"
                )
            for name, cell in zip(header, row, strict=True):
                columns[name].append(cell)
            names.append(f"line {reader.line_num}")
    return Table(path, columns, names)


def _from_arrow(path: Path, table: Any) -> Table:
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    return Table(path, columns, [f"row {i}" for i in range(table.num_rows)])


def _read_parquet(path: Path) -> Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise CrlValueError(f"files: {path} is not a readable Parquet file ({exc})") from None
    return _from_arrow(path, table)


def _read_saved_dataset(path: Path) -> Table:
    """A ``datasets.Dataset.save_to_disk`` directory: ``state.json`` lists its Arrow files (IPC
    streams), read here with pyarrow (``datasets`` flattens any index mapping before saving)."""
    import pyarrow as pa

    try:
        state = json.loads((path / _HF_STATE).read_text(encoding="utf-8"))
        files = [path / entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CrlValueError(
            f"files: {path / _HF_STATE} is not a datasets save_to_disk state file ({exc})"
        ) from None
    tables = []
    for file in files:
        try:
            with pa.memory_map(str(file)) as source:
                tables.append(pa.ipc.open_stream(source).read_all())
        except (pa.ArrowException, OSError) as exc:
            raise CrlValueError(f"files: {file} is not a readable Arrow file ({exc})") from None
    if not tables:
        raise CrlValueError(f"files: the saved dataset {path} lists no data files")
    return _from_arrow(path, pa.concat_tables(tables))


def _directory_reader(path: Path) -> Callable[[Path], Table]:
    if (path / _HF_STATE).is_file():
        return _read_saved_dataset
    if (path / _HF_DICT).is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / _HF_STATE).is_file())
        raise CrlValueError(
            f"files: {path} holds a DatasetDict with splits {splits}; give one split's "
            f"directory, e.g. {path / (splits[0] if splits else 'train')}"
        )
    entries = sorted(p.name for p in path.iterdir())[:6]
    raise CrlValueError(
        f"files: {path} is a directory, not a file; a directory must be written by datasets' "
        f"save_to_disk (with {_HF_STATE}); it holds {entries or 'nothing'}"
    )


_READERS: dict[str, Callable[[Path], Table]] = {
    ".jsonl": _read_jsonl, ".csv": _read_csv, ".tsv": _read_csv, ".parquet": _read_parquet,
}


def is_table(path: Path) -> bool:
    """True when ``path`` is a table of texts (a table suffix, or a directory)."""
    return path.is_dir() or path.suffix.lower() in _READERS


def read_table(path: Path) -> Table:
    """The columns of the table file or saved dataset at ``path``.

    Raises:
        CrlValueError: for an unknown suffix, a directory that is not a saved dataset, an empty
            file, a malformed line (with its number) or an unreadable file.
    """
    if path.is_dir():
        table = _directory_reader(path)(path)
    else:
        reader = _READERS.get(path.suffix.lower())
        if reader is None:
            raise CrlValueError(f"files: unsupported table type {path.suffix!r} of {path}")
        table = reader(path)
    if len(table) == 0:
        raise CrlValueError(f"files: {path} holds no pairs (no rows)")
    return table
