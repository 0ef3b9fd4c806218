"""``crl mine``'s file side: read the user's table, mine, and write the same rows with
``num_negatives`` more columns (``negative_1`` ... ``negative_H``) in ``.jsonl``, ``.csv``,
``.tsv`` or ``.parquet``, which ``crl train`` reads back with
``data.files.columns.negatives: [negative_1, ..., negative_H]`` (docs/data.md)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from crl.data.config import ColumnsConfig
from crl.data.files import read_text_table
from crl.data.files.columns import texts_of_column
from crl.errors import CrlValueError
from crl.eval.encoder import TextEncoder
from crl.mine.mining import MinedNegatives, MiningOptions, mine_hard_negatives
from crl.mine.search import Backend
from crl.rundir import atomic_write

#: The formats :func:`mine_file` writes, by the suffix of ``out``.
OUT_SUFFIXES = (".jsonl", ".csv", ".tsv", ".parquet")


@dataclass
class MineReport:
    """What :func:`mine_file` wrote.

    Attributes:
        out: The file written.
        rows_in: Rows read.
        rows_out: Rows written (those with all their negatives).
        columns: The new columns, in order.
        mined: The mining result, row by row of the input.
    """

    out: Path
    rows_in: int
    rows_out: int
    columns: list[str]
    mined: MinedNegatives


def _cell(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


def _write(out: Path, columns: dict[str, list[Any]]) -> None:
    names = list(columns)
    rows = len(next(iter(columns.values())))
    suffix = out.suffix.lower()
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pydict(columns)
        atomic_write(out, lambda f: pq.write_table(table, f))
        return

    def text(f: IO[bytes]) -> None:
        buffer = io.StringIO(newline="")
        if suffix == ".jsonl":
            for i in range(rows):
                buffer.write(json.dumps({n: columns[n][i] for n in names},
                                        ensure_ascii=False) + "\n")
        else:
            writer = csv.writer(buffer, delimiter="\t" if suffix == ".tsv" else ",",
                                lineterminator="\n")
            writer.writerow(names)
            writer.writerows([_cell(columns[n][i]) for n in names] for i in range(rows))
        f.write(buffer.getvalue().encode("utf-8"))

    atomic_write(out, text)


def mine_file(data: str | Path, model: TextEncoder | str | Path, out: str | Path, *,
              columns: ColumnsConfig | None = None, options: MiningOptions | None = None,
              prefix: str = "negative", backend: Backend = "auto", device: str = "cpu",
              batch_size: int = 64) -> MineReport:
    """Mine hard negatives for the pairs of ``data`` and write them to ``out``.

    Args:
        data: A table of texts (``.jsonl``, ``.csv``, ``.tsv``, ``.parquet`` or a
            ``save_to_disk`` directory).
        model: The scoring model (:func:`~crl.mine.mining.mine_hard_negatives`).
        out: ``.jsonl``, ``.csv``, ``.tsv`` or ``.parquet`` to write (atomically): the rows
            that got ``num_negatives`` negatives, in input order, every column kept, and the
            columns ``{prefix}_1`` ... ``{prefix}_H`` added.
        columns: Which columns are the anchors (``a``) and positives (``b``).
        options: The filters (:class:`~crl.mine.mining.MiningOptions`).
        prefix: The new columns' prefix.
        backend: The search backend.
        device: Where a loaded model runs.
        batch_size: Texts per forward pass.

    Raises:
        CrlValueError: for a bad file, column or cell (naming it), an ``out`` of another type,
            a new column that exists already, or no row with enough negatives.
    """
    out = Path(out)
    if out.suffix.lower() not in OUT_SUFFIXES or out.is_dir():
        raise CrlValueError(f"mine: --out must be a {', '.join(OUT_SUFFIXES)} file; got {out}")
    options = options or MiningOptions()
    columns = columns or ColumnsConfig()
    table = read_text_table(data)
    names = [f"{prefix}_{k}" for k in range(1, options.num_negatives + 1)]
    taken = [n for n in names if n in table.columns]
    if taken:
        raise CrlValueError(f"mine: {table.path} already has the column(s) {taken}; give "
                            "another --prefix for the new columns")
    anchors = texts_of_column(table, columns.a)
    positives = texts_of_column(table, columns.b)
    mined = mine_hard_negatives(anchors, positives, model, options=options, backend=backend,
                                device=device, batch_size=batch_size)
    keep = [i for i, negs in enumerate(mined.negatives) if negs is not None]
    if not keep:
        raise CrlValueError(
            f"mine: no row of {table.path} got {options.num_negatives} negatives that pass the "
            "filters; lower --num-negatives, --range-min or the margins, or raise --range-max "
            "or --max-score")
    written = {name: [cells[i] for i in keep] for name, cells in table.columns.items()}
    for k, name in enumerate(names):
        written[name] = [mined.negatives[i][k] for i in keep]  # type: ignore[index]
    _write(out, written)
    return MineReport(out, len(table), len(keep), names, mined)


__all__ = ["OUT_SUFFIXES", "MineReport", "mine_file"]
