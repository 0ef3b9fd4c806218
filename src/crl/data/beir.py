"""Retrieval data with relevance judgements (docs/evaluation.md, "qrels formats"): a directory
in BEIR's layout (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``), a qrels file
(BEIR's TSV with a header, or TREC's ``qid Q0 docid grade``), or a table of pairs whose rows
name the documents relevant to their query (:func:`ir_data_from_table`).

Everything is read as strings: ids are compared as text, as BEIR and the peers do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crl.data.config import ColumnsConfig
from crl.data.files import read_text_table
from crl.data.files.columns import texts_of_column
from crl.data.files.tables import Table
from crl.errors import CrlValueError

#: Header names of BEIR's qrels columns (and the spellings other tools write).
_QUERY_HEADERS = ("query-id", "query_id", "qid")
_DOC_HEADERS = ("corpus-id", "corpus_id", "doc-id", "doc_id", "docid")


@dataclass(frozen=True)
class IRData:
    """Queries, a corpus and the judgements between them.

    Attributes:
        query_ids, queries: The queries' ids and texts (those the judgements name, in file
            order).
        doc_ids, docs: The corpus: ids and texts (BEIR: ``title + " " + text``, stripped).
        qrels: ``query id -> {doc id: grade}``; a grade ``> 0`` is relevant.
        source: Where the data came from, for messages and the metrics file.
    """

    query_ids: list[str]
    queries: list[str]
    doc_ids: list[str]
    docs: list[str]
    qrels: dict[str, dict[str, int]]
    source: dict[str, Any] = field(default_factory=dict)


def _cell(table: Table, i: int, name: str) -> str:
    value = table.columns[name][i]
    if value is None or (isinstance(value, str) and not value.strip()):
        raise CrlValueError(f"{table.where(i, name)}: expected a non-empty value, found "
                            f"{value!r}")
    return str(value)


def _records(path: Path, id_column: str, text_columns: tuple[str, ...]) -> tuple[list[str],
                                                                                 list[str]]:
    """Ids and texts of a BEIR ``corpus.jsonl`` / ``queries.jsonl`` (text: the non-empty
    ``text_columns`` joined by a space)."""
    if not path.is_file():
        raise CrlValueError(f"beir: {path} does not exist; a BEIR directory holds corpus.jsonl, "
                            "queries.jsonl and qrels/<split>.tsv")
    table = read_text_table(path)
    if id_column not in table.columns or "text" not in table.columns:
        raise CrlValueError(f"beir: {path} needs the fields {id_column!r} and 'text'; its fields "
                            f"are {list(table.columns)}")
    ids = [_cell(table, i, id_column) for i in range(len(table))]
    texts = []
    for i in range(len(table)):
        parts = [str(table.columns[c][i]).strip() for c in text_columns
                 if c in table.columns and table.columns[c][i]]
        text = " ".join(p for p in parts if p)
        if not text:
            raise CrlValueError(f"{table.where(i)}: empty text")
        texts.append(text)
    seen: set[str] = set()
    for i, key in enumerate(ids):
        if key in seen:
            raise CrlValueError(f"{table.where(i, id_column)}: the id {key!r} appears twice")
        seen.add(key)
    return ids, texts


def _grade(path: Path, lineno: int, text: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        raise CrlValueError(f"qrels: {path} line {lineno}: the grade must be an integer; got "
                            f"{text!r}") from None


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """The judgements of a qrels file: ``query id -> {doc id: grade}``.

    Two layouts are read: BEIR's TSV (a header ``query-id corpus-id score``, then one judgement
    a line) and TREC's (``qid Q0 docid grade``, whitespace-separated, no header); a 3-column
    file without a header is read as ``qid docid grade``.

    Raises:
        CrlValueError: for a missing or empty file, a line with another number of fields, a
            grade that is not an integer, or a (query, doc) pair judged twice.

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "test.tsv"
        >>> _ = f.write_text("query-id\\tcorpus-id\\tscore\\nq1\\td1\\t1\\n")
        >>> read_qrels(f)
        {'q1': {'d1': 1}}
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise CrlValueError(f"qrels: {path} does not exist (expected a qrels file: BEIR's TSV "
                            "'query-id corpus-id score' or TREC's 'qid Q0 docid grade')")
    lines = path.read_text(encoding="utf-8").splitlines()
    qrels: dict[str, dict[str, int]] = {}
    start = 0
    if lines:
        head = [f.strip().lower() for f in lines[0].split("\t" if "\t" in lines[0] else None)]
        if head and head[0] in _QUERY_HEADERS and len(head) > 1 and head[1] in _DOC_HEADERS:
            start = 1
    for lineno, line in enumerate(lines[start:], start=start + 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) == 4:
            query, doc, grade = fields[0], fields[2], _grade(path, lineno, fields[3])
        elif len(fields) == 3:
            query, doc, grade = fields[0], fields[1], _grade(path, lineno, fields[2])
        else:
            raise CrlValueError(f"qrels: {path} line {lineno}: expected 3 fields (query-id "
                                f"corpus-id score) or 4 (qid Q0 docid grade); got {len(fields)}")
        judged = qrels.setdefault(query, {})
        if doc in judged:
            raise CrlValueError(f"qrels: {path} line {lineno}: ({query!r}, {doc!r}) is judged "
                                "twice")
        judged[doc] = grade
    if not qrels:
        raise CrlValueError(f"qrels: {path} holds no judgements")
    return qrels


def check_qrels(qrels: dict[str, dict[str, int]], query_ids: list[str], doc_ids: list[str],
                where: str) -> None:
    """Every query and document the judgements name exists.

    Raises:
        CrlValueError: naming the first unknown ids and how many there are.
    """
    for kind, names, known in (("query", list(qrels), set(query_ids)),
                               ("corpus", sorted({d for j in qrels.values() for d in j}),
                                set(doc_ids))):
        unknown = [n for n in names if n not in known]
        if unknown:
            raise CrlValueError(f"{where}: the qrels name {len(unknown)} {kind} id(s) that are "
                                f"not in the {kind} (first: {unknown[:3]})")


def load_beir(directory: str | Path, *, split: str = "test",
              qrels: str | Path | None = None) -> IRData:
    """A BEIR directory: ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl``
    (``_id``, ``text``) and the judgements ``qrels/<split>.tsv`` (or the file ``qrels``).

    Only the queries the judgements name are kept (``queries.jsonl`` holds every split's).

    Raises:
        CrlValueError: for a missing file, a record without an id or text, a repeated id, or
            judgements naming a query or document that is not there.
    """
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise CrlValueError(f"beir: {root} is not a directory (expected corpus.jsonl, "
                            "queries.jsonl and qrels/<split>.tsv)")
    qrels_path = Path(qrels).expanduser() if qrels is not None else root / "qrels" / f"{split}.tsv"
    doc_ids, docs = _records(root / "corpus.jsonl", "_id", ("title", "text"))
    all_query_ids, all_queries = _records(root / "queries.jsonl", "_id", ("text",))
    judged = read_qrels(qrels_path)
    check_qrels(judged, all_query_ids, doc_ids, f"beir: {qrels_path}")
    keep = [i for i, q in enumerate(all_query_ids) if q in judged]
    return IRData([all_query_ids[i] for i in keep], [all_queries[i] for i in keep], doc_ids,
                  docs, judged, {"beir": str(root.resolve()), "qrels": str(qrels_path.resolve())})


def _ids(cell: Any) -> list[str]:
    if cell is None:
        return []
    if isinstance(cell, (list, tuple)):
        return [str(c) for c in cell]
    text = str(cell).strip()
    return [t for t in (s.strip() for s in text.replace(";", ",").split(",")) if t]


def ir_data_from_table(path: str | Path, columns: ColumnsConfig | None = None, *,
                       id_column: str | None = None,
                       relevant_column: str | None = None,
                       rows: Sequence[int] | None = None) -> IRData:
    """Queries, corpus and judgements from a table of pairs.

    The queries are the distinct ``a`` texts; the corpus the distinct ``b`` texts (or, with
    ``id_column``, one document per distinct id). A query's relevant documents (grade 1) are
    the ``b`` of every row with that query (so the same docstring above several functions
    gives several relevant functions), and the ids listed in its rows' ``relevant_column``
    (a list, or ids separated by commas). ``rows``: only these rows (None: all).

    Raises:
        CrlValueError: for a missing column, an empty text, or a relevant id that is no
            document's.
    """
    columns = columns or ColumnsConfig()
    if relevant_column is not None and id_column is None:
        raise CrlValueError(f"files: a relevant-ids column ({relevant_column!r}) needs the column "
                            "of document ids it refers to (id_column, --id-column)")
    table = read_text_table(path)
    a, b = texts_of_column(table, columns.a), texts_of_column(table, columns.b)
    rows = list(range(len(table))) if rows is None else list(rows)
    width = len(str(len(rows)))  # zero-padded row ids sort (and break ties) in row order
    for name in (id_column, relevant_column):
        if name is not None and name not in table.columns:
            raise CrlValueError(f"files: {table.path} has no column {name!r}; its columns are "
                                f"{list(table.columns)}")
    doc_ids: list[str] = []
    docs: list[str] = []
    row_doc: list[str] = []
    known: dict[str, int] = {}
    for i in rows:
        text = b[i]
        key = _cell(table, i, id_column) if id_column else text
        if key not in known:
            known[key] = len(doc_ids)
            doc_ids.append(key if id_column else f"{len(doc_ids):0{width}d}")
            docs.append(text)
        row_doc.append(doc_ids[known[key]])
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for i, doc in zip(rows, row_doc, strict=True):
        query = queries.setdefault(a[i], f"{len(queries):0{width}d}")
        relevant = qrels.setdefault(query, {})
        relevant[doc] = 1
        for extra in _ids(table.columns[relevant_column][i]) if relevant_column else []:
            if extra not in known:
                raise CrlValueError(f"{table.where(i, relevant_column)}: relevant id {extra!r} "
                                    f"is no document's {id_column or 'row'} id")
            relevant[doc_ids[known[extra]]] = 1
    return IRData(list(queries.values()), list(queries), doc_ids, docs, qrels,
                  {"file": str(Path(path).resolve())})


__all__ = ["IRData", "check_qrels", "ir_data_from_table", "load_beir", "read_qrels"]
