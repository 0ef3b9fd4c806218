"""Score a model on data it was not trained with (``crl eval --model ... --data/--beir``): a
table of pairs (paired retrieval metrics and, by query, the IR metrics) or queries, a corpus and
qrels (docs/evaluation.md).

The model comes from :func:`crl.eval.encoder.load_encoder`; nothing here trains.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from crl.data.beir import IRData, ir_data_from_table
from crl.data.config import ColumnsConfig
from crl.data.files import load_pair_file, read_split_column
from crl.data.splits import split_by_column
from crl.errors import CrlValueError
from crl.eval.encoder import Encoder
from crl.eval.ir import IR_KS, Relevance, ir_metrics
from crl.eval.retrieval import DEFAULT_KS, retrieval_metrics

#: The splits ``--split`` takes for a file with a split column (``all``: every row).
FILE_SPLITS = ("all", "train", "val", "test")


def relevance_of(data: IRData) -> tuple[Relevance, Tensor]:
    """The judgements of ``data`` by row (:class:`~crl.eval.ir.Relevance`) and the tie rank of
    each document: the position of its id in ascending string order (the peer's tie rule).

    Example:
        >>> data = IRData(["q"], ["a question"], ["d2", "d10"], ["x", "y"], {"q": {"d2": 1}})
        >>> rel, rank = relevance_of(data)
        >>> rel.doc.tolist(), rank.tolist()  # "d10" sorts before "d2"
        ([0], [1, 0])
    """
    query_row = {q: i for i, q in enumerate(data.query_ids)}
    doc_row = {d: j for j, d in enumerate(data.doc_ids)}
    rows = [(query_row[q], doc_row[d], float(g)) for q, judged in data.qrels.items()
            if q in query_row for d, g in judged.items()]
    query, doc, grade = zip(*rows, strict=True) if rows else ((), (), ())
    relevance = Relevance(torch.tensor(query, dtype=torch.int64),
                          torch.tensor(doc, dtype=torch.int64),
                          torch.tensor(grade, dtype=torch.float64))
    order = sorted(range(len(data.doc_ids)), key=data.doc_ids.__getitem__)
    rank = torch.empty(len(order), dtype=torch.int64)
    rank[torch.tensor(order, dtype=torch.int64)] = torch.arange(len(order))
    return relevance, rank


def score_ir(encoder: Encoder, data: IRData, *, ks: Sequence[int] = IR_KS,
             corpus_block: int = 16384, progress: bool = False) -> dict[str, float]:
    """The IR metrics of ``encoder`` on queries, corpus and qrels (:func:`crl.eval.ir_metrics`):
    queries through tower ``a``, documents through tower ``b``.

    Returns:
        ``ir/...`` metrics, ``ir/num_queries`` and ``ir/num_docs``.
    """
    queries = encoder.encode(data.queries, view="a", progress=progress)  # (Q, D)
    corpus = encoder.encode(data.docs, view="b", progress=progress)  # (N, D)
    relevance, rank = relevance_of(data)
    out = ir_metrics(queries, corpus, relevance, ks=ks, tie_rank=rank,
                     corpus_block=corpus_block)
    out["ir/num_docs"] = float(len(data.docs))
    return out


def _rows(path: str | Path, split: str, split_column: str | None) -> list[int] | None:
    """The rows of ``path`` that ``split`` names (None: every row)."""
    if split not in FILE_SPLITS:
        raise CrlValueError(f"eval: --split must be one of {', '.join(FILE_SPLITS)} for a file; "
                            f"got {split!r}")
    if split == "all":
        return None
    if split_column is None:
        raise CrlValueError(f"eval: --split {split} needs --split-column (the column naming each "
                            "row's split); without it every row of the file is scored")
    parts = dict(zip(("train", "val", "test"),
                     split_by_column(*read_split_column(path, split_column)), strict=True))
    rows: list[int] = parts[split].tolist()
    if len(rows) < 2:
        raise CrlValueError(f"eval: the {split} rows of {path} number {len(rows)}; need >= 2")
    return rows


def score_file(encoder: Encoder, path: str | Path, *, columns: ColumnsConfig | None = None,
               split: str = "all", split_column: str | None = None,
               ks: Sequence[int] = DEFAULT_KS, ir: bool = True, id_column: str | None = None,
               relevant_column: str | None = None, block_size: int = 1024,
               progress: bool = False) -> dict[str, Any]:
    """Score ``encoder`` on the pairs of a file: every row, or the rows of one split.

    The paired retrieval metrics (:func:`crl.eval.retrieval_metrics`, both ways, ``b[i]`` the
    positive of ``a[i]``), and with ``ir`` the IR metrics of the file read as queries and a
    corpus (:func:`crl.data.beir.ir_data_from_table`: the distinct ``a`` texts against the
    distinct ``b`` texts of the same rows, relevant: the ``b`` of each of a query's rows and
    the ids in ``relevant_column``).

    Args:
        encoder: The model (:func:`crl.eval.encoder.load_encoder`).
        path: A table of texts, or a ``.npz`` of vectors (paired metrics only).
        columns: The column map (None: the run's, else ``a`` and ``b``).
        split: ``all``, or ``train``/``val``/``test`` with ``split_column``.
        split_column: The column naming each row's split.
        ks: Cut-offs of recall@k and of the IR metrics.
        ir: Also the IR metrics (text tables only).
        id_column, relevant_column: See :func:`crl.data.beir.ir_data_from_table`.
        block_size: Rows of scores computed at once.
        progress: Show progress bars while encoding.

    Returns:
        The metrics, and ``num_pairs``.

    Raises:
        CrlValueError: for a bad file, column, split or cut-off (naming it).
    """
    if columns is None:
        columns = encoder.config.data.files.columns if encoder.config is not None else (
            ColumnsConfig())
    rows = _rows(path, split, split_column)
    dataset, _ = load_pair_file(path, columns)
    if rows is not None:
        dataset = dataset.subset(rows)
    if len(dataset) < 2:
        raise CrlValueError(f"eval: {path} holds {len(dataset)} pair(s); need >= 2")
    za, zb = encoder.encode_pairs(dataset)
    out: dict[str, Any] = dict(retrieval_metrics(za, zb, ks=ks, block_size=block_size))
    if ir and dataset.is_text:
        data = ir_data_from_table(path, columns, id_column=id_column,
                                  relevant_column=relevant_column, rows=rows)
        out.update(score_ir(encoder, data, ks=ks, progress=progress))
    out["num_pairs"] = float(len(dataset))
    return out


def _columns(encoder: Encoder, a: str | None, b: str | None) -> ColumnsConfig:
    """The column map of a file: the run's (else ``a``, ``b``) with ``a`` and ``b`` over it."""
    base = encoder.config.data.files.columns if encoder.config is not None else ColumnsConfig()
    update = {k: v for k, v in (("a", a), ("b", b)) if v is not None}
    return ColumnsConfig.model_validate({**base.model_dump(), **update})


def evaluate_model(spec: str | Path, *, data: str | Path | None = None,
                   beir: str | Path | None = None, qrels: str | Path | None = None,
                   split: str | None = None, split_column: str | None = None,
                   ks: Sequence[int] | None = None, a_column: str | None = None,
                   b_column: str | None = None, id_column: str | None = None,
                   relevant_column: str | None = None, device: str = "cpu",
                   batch_size: int = 256, trusted_factories: Collection[str] = (),
                   progress: bool = False) -> dict[str, Any]:
    """Score the model ``spec`` (``minilm``, a model directory or a run:
    :func:`crl.eval.encoder.load_encoder`) on a file of pairs (``data``,
    :func:`score_file`) or a BEIR directory (``beir``, with ``qrels`` or
    ``qrels/<split>.tsv``; :func:`score_ir`), without training.

    The data is read (and checked) before the model is loaded. ``split``: for ``data``
    ``all`` (default) or a split of ``split_column``; for ``beir`` the qrels split (``test``).
    ``ks``: the cut-offs (default 1, 5, 10 for a file; 1, 5, 10, 100 for qrels).
    ``a_column``, ``b_column``: the file's columns (default: the run's, else ``a`` and ``b``).

    Returns:
        ``{"model", "model_kind", "data", "split", "metrics"}`` (what ``crl eval --out``
        writes).

    Raises:
        CrlValueError: for both or neither of ``data`` and ``beir``, and as the functions
            above.
    """
    from crl.data.beir import load_beir
    from crl.eval.encoder import load_encoder

    if (data is None) == (beir is None):
        raise CrlValueError("eval: give a file of pairs (data) or a BEIR directory (beir), "
                            "one of them")
    ir_data = load_beir(beir, split=split or "test", qrels=qrels) if beir is not None else None
    encoder = load_encoder(spec, device=device, batch_size=batch_size,
                           trusted_factories=trusted_factories)
    if ir_data is not None:
        metrics: dict[str, Any] = score_ir(encoder, ir_data, ks=ks or IR_KS, progress=progress)
        where: dict[str, Any] = ir_data.source
    else:
        assert data is not None
        metrics = score_file(encoder, data, columns=_columns(encoder, a_column, b_column),
                             split=split or "all", split_column=split_column,
                             ks=ks or DEFAULT_KS, id_column=id_column,
                             relevant_column=relevant_column, progress=progress)
        where = {"file": str(Path(data).resolve()), "split_column": split_column}
    return {"model": encoder.name, "model_kind": encoder.kind, "data": where,
            "split": split or ("test" if beir is not None else "all"), "metrics": metrics}


__all__ = ["FILE_SPLITS", "evaluate_model", "relevance_of", "score_file", "score_ir"]
