"""Read a user's table of texts: ``.jsonl``, ``.csv``/``.tsv``, ``.parquet``, or a directory
written by Hugging Face ``datasets``' ``save_to_disk``, into named columns of Python values.

Every reader returns a :class:`Table` that knows how to name a row in an error message (the
line of a text file, the 0-based row index of a columnar file). Nothing is downloaded.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl._validation import clip_text
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


#: The first bytes of compressed files, and the tool that decompresses each.
_COMPRESSED = ((b"\x1f\x8b", "gzip", "gunzip -c"), (b"BZh", "bzip2", "bunzip2 -c"),
               (b"\xfd7zXZ\x00", "xz", "unxz -c"), (b"\x28\xb5\x2f\xfd", "zstd", "unzstd -c"),
               (b"PK\x03\x04", "zip", "unzip -p"))


def _read_text(path: Path) -> str:
    """The file as text: UTF-8, a leading byte-order mark dropped (as spreadsheets write it).

    Raises:
        CrlValueError: for a compressed file (naming the compression) or bytes that are not
            UTF-8 (naming the line and the byte).
    """
    data = path.read_bytes()
    for magic, name, tool in _COMPRESSED:
        if data.startswith(magic):
            raise CrlValueError(
                f"files: {path} is {name}-compressed, not text; decompress it first (for "
                f"example `{tool} {path.name} > plain{path.suffix}`) and give the plain file")
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise CrlValueError(
            f"files: {path} is not UTF-8 text: line {line} holds the byte "
            f"0x{data[exc.start]:02x} (offset {exc.start}), which is not UTF-8; save the file "
            "as UTF-8 (for example `iconv -f latin1 -t utf-8`)") from None


def _json_line(path: Path, lineno: int, line: str) -> Any:
    try:
        return json.loads(line)
    except RecursionError:
        raise CrlValueError(
            f"files: {path}, line {lineno} nests its JSON deeper than the parser can follow; "
            "give one flat JSON object per line (text fields, lists of texts)") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else clip_text(str(exc), 120)
        raise CrlValueError(
            f"files: {path}, line {lineno} is not valid JSON ({reason})") from None


def _read_jsonl(path: Path) -> Table:
    records: list[dict[str, Any]] = []
    names: list[str] = []
    # Universal newlines, as open() reads: a U+2028 inside a JSON string ends no line.
    for lineno, line in enumerate(io.StringIO(_read_text(path), newline=None), start=1):
        if not line.strip():
            continue
        record = _json_line(path, lineno, line)
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


@contextmanager
def _field_limit(size: int) -> Iterator[None]:
    """Let csv read a cell as large as ``size`` characters (its default limit is 131,072), so
    a long text is read, not refused; the limit is restored afterwards."""
    old = csv.field_size_limit()
    csv.field_size_limit(max(old, size + 1))
    try:
        yield
    finally:
        csv.field_size_limit(old)


def _read_csv(path: Path) -> Table:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    text = _read_text(path)
    with _field_limit(len(text)):
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
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
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CrlValueError(
            f"files: {path / _HF_STATE} is not a datasets save_to_disk state file "
            f"({clip_text(str(exc) or type(exc).__name__, 120)})"
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
