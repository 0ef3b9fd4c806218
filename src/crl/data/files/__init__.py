"""A user's own pairs: ``.npz`` arrays (vectors), or texts in ``.jsonl``, ``.csv``/``.tsv``,
``.parquet`` or a directory written by Hugging Face ``datasets``' ``save_to_disk``, read through
a column map (docs/data.md, "Your own files")."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from crl.data.base import PairDataset
from crl.data.config import ColumnsConfig
from crl.data.files.columns import pairs_from_table, texts_of_column
from crl.data.files.npz import load_npz
from crl.data.files.tables import TABLE_SUFFIXES, Table, read_table
from crl.errors import CrlValueError

SUPPORTED_SUFFIXES = (".npz", *TABLE_SUFFIXES)


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _checked_path(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        return p  # read_table says whether it is a saved dataset
    if p.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise CrlValueError(
            f"files: unsupported file type {p.suffix or '(no extension)'!r} of {p}; supported: "
            + ", ".join(SUPPORTED_SUFFIXES) + ", or a datasets save_to_disk directory"
        )
    if not p.exists():
        raise FileNotFoundError(f"files: no such file {p}")
    if not p.is_file():
        raise CrlValueError(f"files: {p} is not a regular file")
    if p.stat().st_size == 0:
        raise CrlValueError(f"files: {p} is empty (0 bytes)")
    return p


def _provenance(p: Path) -> dict[str, Any]:
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    return {"path": str(p.resolve()), "bytes": sum(f.stat().st_size for f in files),
            "sha256": _sha256(files)}


def read_text_table(path: str | Path) -> Table:
    """The table of texts at ``path`` (any supported format but ``.npz``), checked.

    Raises:
        FileNotFoundError: if the file does not exist.
        CrlValueError: for a ``.npz``, an unsupported extension, an empty file, a directory that
            is not a saved dataset or a malformed line.
    """
    p = _checked_path(path)
    if p.suffix.lower() == ".npz" and not p.is_dir():
        raise CrlValueError(f"files: {p} holds vectors, not texts; give a table of texts "
                            f"({', '.join(TABLE_SUFFIXES)} or a save_to_disk directory)")
    return read_table(p)


def read_texts(path: str | Path, column: str) -> list[str]:
    """The texts of one column of a table file (e.g. to embed them with ``crl encode``).

    Raises:
        CrlValueError: as :func:`read_text_table`, and for a missing column, a non-text cell
            or an empty text (naming the row).
    """
    return texts_of_column(read_text_table(path), column)


def read_split_column(path: str | Path, column: str) -> tuple[list[object], list[str]]:
    """The cells of the split column ``column`` of a table, and how each row is named in an
    error (:func:`crl.data.splits.split_by_column`).

    Raises:
        CrlValueError: for a ``.npz`` (arrays have no split column) or a missing column.
    """
    table = read_text_table(path)
    if column not in table.columns:
        raise CrlValueError(f"files: {table.path} has no column {column!r} (data.files."
                            f"split_column); its columns are {list(table.columns)}")
    return list(table.columns[column]), [table.where(i, column) for i in range(len(table))]


def load_pair_file(path: str | Path,
                   columns: ColumnsConfig | None = None) -> tuple[PairDataset, dict[str, Any]]:
    """Load the pairs of ``path`` and its provenance (path, size, sha256).

    Args:
        path: A ``.npz`` with float arrays ``a (N, D_a)``, ``b (N, D_b)`` and optional integer
            ``labels (N,)``; or a table of texts: ``.jsonl`` (one JSON object per line),
            ``.csv``/``.tsv`` (a header line of column names), ``.parquet``, or a directory
            written by ``datasets.Dataset.save_to_disk``.
        columns: The column map of a table (None: columns ``a``, ``b``, and ``label`` if
            present); ignored for ``.npz``.

    Returns:
        The whole file as one data set (text tables: a :class:`TextPairDataset`, with hard
        negatives when ``columns.negatives`` names columns), and its provenance.

    Raises:
        FileNotFoundError: if the file does not exist.
        CrlValueError: for an unsupported extension, a directory that is not a saved dataset,
            an empty file, a missing array or column (listing those there are), a non-text cell,
            an empty text, a bad label, mismatched lengths or a malformed line; each names the
            file and, for a cell, the row and the column.
    """
    p = _checked_path(path)
    if p.is_file() and p.suffix.lower() == ".npz":
        dataset: PairDataset = load_npz(p)
    else:
        dataset = pairs_from_table(read_table(p), columns or ColumnsConfig())
    return dataset, _provenance(p)


__all__ = ["SUPPORTED_SUFFIXES", "load_pair_file", "read_split_column", "read_text_table",
           "read_texts"]
