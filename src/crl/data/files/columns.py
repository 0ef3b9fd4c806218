"""The column map: a user's column names -> the views ``a``, ``b``, a label and hard negatives.

Every cell is checked once here, at the boundary: texts must be non-empty strings, labels
integers; an error names the file, the row and the column, and what was found.
"""

from __future__ import annotations

from typing import Any

import torch

from crl._validation import describe
from crl.data.base import TextPairDataset
from crl.data.config import ColumnsConfig
from crl.data.files.tables import Table
from crl.errors import CrlValueError

#: The column read as the label when ``columns.label`` is not set (used only if present).
DEFAULT_LABEL_COLUMN = "label"


def _column(table: Table, name: str, key: str) -> list[Any]:
    if name not in table.columns:
        hint = f" (set data.files.columns.{key})" if key != "text" else ""
        raise CrlValueError(
            f"files: {table.path} has no column {name!r}{hint}; its columns are "
            f"{list(table.columns)}"
        )
    return table.columns[name]


def _check_text(table: Table, i: int, name: str, cell: Any) -> str:
    if not isinstance(cell, str):
        found = "nothing (the row has no value)" if cell is None else (
            f"{type(cell).__name__} {describe(cell)}")
        raise CrlValueError(f"{table.where(i, name)}: expected text, found {found}")
    if not cell.strip():
        raise CrlValueError(f"{table.where(i, name)}: empty text {cell!r}")
    return cell


def _texts(table: Table, name: str, key: str) -> list[str]:
    return [_check_text(table, i, name, cell)
            for i, cell in enumerate(_column(table, name, key))]


def _negatives(table: Table, names: list[str]) -> list[list[str]]:
    """Each row's hard negatives: one text per column, or a list of texts per cell (as
    ``datasets`` and Parquet store a ``negatives`` list column), in column order."""
    rows: list[list[str]] = [[] for _ in range(len(table))]
    for name in names:
        for i, cell in enumerate(_column(table, name, "negatives")):
            items = list(cell) if isinstance(cell, (list, tuple)) else [cell]
            rows[i] += [_check_text(table, i, name, item) for item in items]
    width = len(rows[0])
    for i, row in enumerate(rows):
        if len(row) != width or not row:
            raise CrlValueError(
                f"{table.where(i)}: {len(row)} hard negative(s) in columns {names}, where "
                f"{table.row_names[0]} has {width}; every row needs the same number (>= 1)"
            )
    return rows


def _label(table: Table, i: int, name: str, cell: Any) -> int:
    if isinstance(cell, int) and not isinstance(cell, bool):
        return cell
    if isinstance(cell, float) and cell.is_integer():
        return int(cell)
    if isinstance(cell, str):
        try:
            return int(cell.strip())
        except ValueError:
            pass
    found = "nothing (the row has no value)" if cell is None else describe(cell)
    raise CrlValueError(f"{table.where(i, name)}: expected an integer class id, found {found}")


def _labels(table: Table, name: str | None) -> torch.Tensor | None:
    if name is None:
        if DEFAULT_LABEL_COLUMN not in table.columns:
            return None
        name = DEFAULT_LABEL_COLUMN
    cells = _column(table, name, "label")
    return torch.tensor([_label(table, i, name, c) for i, c in enumerate(cells)],
                        dtype=torch.long)


def texts_of_column(table: Table, column: str) -> list[str]:
    """The texts of one column, checked (non-empty strings).

    Raises:
        CrlValueError: for a missing column (listing the columns there are), a cell that is not
            text or an empty text (naming the row).
    """
    return _texts(table, column, "text")


def pairs_from_table(table: Table, columns: ColumnsConfig) -> TextPairDataset:
    """The text pairs of ``table`` under the column map ``columns``.

    Args:
        table: The table read from the user's file.
        columns: Which columns are view ``a``, view ``b``, the label (None: a column named
            ``label`` when there is one) and the hard negatives (columns of view-b texts, or of
            lists of texts; ``H`` in all per row).

    Returns:
        A :class:`TextPairDataset`; with ``H`` negative columns its items carry ``H`` texts.

    Raises:
        CrlValueError: for a missing column, a non-text cell, an empty text or a bad label.
    """
    a = _texts(table, columns.a, "a")
    b = _texts(table, columns.b, "b")
    negatives = _negatives(table, columns.negatives) if columns.negatives else None
    return TextPairDataset(a, b, _labels(table, columns.label), negatives=negatives)
