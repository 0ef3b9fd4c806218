"""Retrieval with relevance judgements: a running top-k over corpus blocks, and nDCG@k, MRR@k,
MAP@k, recall@k and precision@k from it (docs/evaluation.md, "Metric definitions").

Conventions (the same as sentence-transformers' ``InformationRetrievalEvaluator``):

- Scores are inner products ``s_qj = q . c_j`` (normalise the embeddings first for cosine).
- The ranking of a query orders the corpus by score, highest first; **tied scores are ordered by
  the document's tie rank** (``tie_rank``, default its position in the corpus; the BEIR loader
  passes the rank of its id in ascending string order, which is the peer's rule), so a ranking
  never depends on the block sizes.
- A document is relevant when its grade is ``> 0``. nDCG uses the grade as the gain (trec_eval's
  and pytrec_eval's ``ndcg_cut``; with 0/1 grades it is the peer's binary nDCG); the other
  metrics are binary.
- Queries without a relevant document are left out (the peer drops them too).
- MAP@k divides by ``min(k, R_q)``, the peer's normaliser (trec_eval's ``map_cut`` divides by
  ``R_q``; the two agree when ``R_q <= k``).

Memory is the inputs plus ``O(query_block x corpus_block)`` scores and ``O(Q x k)`` for the
running top-k: no ``Q x N`` matrix is formed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from crl._validation import check_int_range, check_tensor, describe
from crl.errors import CrlTypeError, CrlValueError
from crl.eval.retrieval import _check_ks as check_ks

#: The cut-offs reported when none are given.
IR_KS: tuple[int, ...] = (1, 5, 10, 100)
#: The metrics :func:`ir_metrics` reports, each at every cut-off.
IR_METRICS: tuple[str, ...] = ("ndcg", "mrr", "map", "recall", "precision")


class TopK(NamedTuple):
    """The best ``k`` documents of each query, best first: ``scores (Q, k)`` and ``indices
    (Q, k)`` (int64 corpus positions; ``-1`` with score ``-inf`` where the corpus has fewer than
    ``k`` documents)."""

    scores: Tensor
    indices: Tensor


class Relevance(NamedTuple):
    """Relevance judgements as three aligned ``(R,)`` arrays: ``query`` (int64, a row of the
    queries), ``doc`` (int64, a row of the corpus) and ``grade`` (float64; relevant when > 0).
    Each (query, doc) pair appears at most once."""

    query: Tensor
    doc: Tensor
    grade: Tensor

    @classmethod
    def pairs(cls, n: int) -> Relevance:
        """Query ``i`` relevant to document ``i`` (grade 1), for ``i < n``: paired data.

        Example:
            >>> Relevance.pairs(2).doc.tolist()
            [0, 1]
        """
        index = torch.arange(n, dtype=torch.int64)
        return cls(index, index.clone(), torch.ones(n, dtype=torch.float64))


def _check_ks(where: str, ks: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted(set(check_ks(where, ks))))


def _block_top_k(scores: Tensor, k: int, rank: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The ``k`` best columns of each row of ``scores (q, c)`` under the order (score down,
    ``rank (c,)`` up): ``(values (q, k'), columns (q, k'))`` with ``k' = min(k, c)``, in no
    particular order.

    ``torch.topk`` picks among tied scores arbitrarily. A row's pick is ambiguous exactly when
    its ``k``-th and ``(k+1)``-th largest scores are equal (one ``topk`` of ``k + 1`` tells);
    those rows are picked again with an integer key: every score above the cut-off first (key
    ``rank``), then the tied ones (key ``n + rank``), lowest key first.
    """
    if scores.shape[1] <= k:  # the whole block
        columns = torch.arange(scores.shape[1], device=scores.device).expand_as(scores)
        return scores, columns
    values, columns = scores.topk(k + 1, dim=1, largest=True, sorted=False)  # (q, k + 1)
    values, order = values.sort(dim=1, descending=True)
    columns = columns.gather(1, order)
    boundary = values[:, k - 1] == values[:, k]  # (q,)
    values, columns = values[:, :k], columns[:, :k]
    if bool(boundary.any()):
        rows = boundary.nonzero().squeeze(1)
        tied, cut = scores[rows], values[rows, k - 1:k]  # (t, c), (t, 1)
        key = torch.where(tied > cut, rank, 2 * n)  # (t, c)
        key = torch.where(tied == cut, rank + n, key)
        picked = key.topk(k, dim=1, largest=False).indices  # (t, k)
        columns[rows] = picked
        values[rows] = tied.gather(1, picked)
    return values, columns


def _merge(scores: Tensor, indices: Tensor, rank_of: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` best of candidates ``scores (q, m)``, ``indices (q, m)`` (``-1``: none), sorted
    by score down then tie rank up (two stable sorts: rank first, then score)."""
    ranks = torch.where(indices >= 0, rank_of[indices.clamp(min=0)],
                        torch.iinfo(torch.int64).max)  # (q, m)
    by_rank = ranks.argsort(dim=1, stable=True)
    scores, indices = scores.gather(1, by_rank), indices.gather(1, by_rank)
    by_score = scores.argsort(dim=1, descending=True, stable=True)[:, :k]  # (q, k)
    return scores.gather(1, by_score), indices.gather(1, by_score)


@torch.no_grad()
def top_k(queries: Tensor, corpus: Tensor, k: int, *, tie_rank: Tensor | None = None,
          query_block: int = 1024, corpus_block: int = 16384) -> TopK:
    """The ``k`` highest-scoring documents of every query, over corpus blocks.

    For each block of ``query_block`` queries the corpus is scored ``corpus_block`` documents at
    a time; each block's best ``k`` are kept and merged into the running best ``k`` whenever
    the kept candidates reach a block's width (and at the end). The result is exact and does
    not depend on the block sizes: ties are ordered by ``tie_rank``. Memory beyond the inputs
    is ``O(query_block x (corpus_block + k))``.

    Args:
        queries: ``(Q, D)`` query embeddings.
        corpus: ``(N, D)`` document embeddings (same device and dtype as ``queries``).
        k: How many documents to keep per query (``>= 1``; more than ``N`` pads with ``-1``).
        tie_rank: ``(N,)`` int64, the order of tied documents (lowest first); None: by
            position in the corpus.
        query_block: Queries scored at once.
        corpus_block: Documents scored at once.

    Returns:
        A :class:`TopK`, best first.

    Raises:
        CrlValueError: on shape mismatch, NaN/Inf, or a bad ``k``, block size or ``tie_rank``.

    Example:
        >>> q = torch.tensor([[1.0, 0.0]]); c = torch.tensor([[0.5, 0.0], [1.0, 0.0], [0.5, 1.0]])
        >>> top_k(q, c, 2).indices.tolist()  # documents 0 and 2 tie; 0 comes first
        [[1, 0]]
    """
    where = "top_k"
    check_tensor(where, "queries", queries, ndim=2)
    check_tensor(where, "corpus", corpus, ndim=2, finite=False)  # checked block by block
    if queries.shape[1] != corpus.shape[1]:
        raise CrlValueError(f"{where}: `queries` and `corpus` must have the same dimension D; "
                            f"got {tuple(queries.shape)} and {tuple(corpus.shape)}")
    check_int_range(where, "k", k, 1, None)
    check_int_range(where, "query_block", query_block, 1, None)
    check_int_range(where, "corpus_block", corpus_block, 1, None)
    n = corpus.shape[0]
    if tie_rank is None:
        tie_rank = torch.arange(n, device=corpus.device)
    elif tuple(tie_rank.shape) != (n,) or tie_rank.dtype != torch.int64:
        raise CrlValueError(f"{where}: `tie_rank` must be an int64 tensor of shape ({n},); got "
                            f"{describe(tie_rank)}")
    tie_rank = tie_rank.to(corpus.device)
    corpus = corpus.to(queries.dtype)
    out_scores, out_indices = [], []
    for q0 in range(0, queries.shape[0], query_block):
        block = queries[q0:q0 + query_block]  # (q, D)
        # the running best k, and the blocks' candidates not merged into it yet: merged when
        # they hold as many columns as a block of scores (few merges, bounded memory)
        pending_scores = [block.new_full((block.shape[0], k), float("-inf"))]  # (q, k)
        pending_idx = [torch.full((block.shape[0], k), -1, dtype=torch.int64,
                                  device=block.device)]
        for c0 in range(0, n, corpus_block):
            docs = corpus[c0:c0 + corpus_block]  # (c, D)
            if q0 == 0:  # a whole-corpus isfinite would cost a copy of the corpus
                check_tensor(where, f"corpus[{c0}:{c0 + len(docs)}]", docs)
            scores = block @ docs.T  # (q, c)
            values, columns = _block_top_k(scores, k, tie_rank[c0:c0 + scores.shape[1]], n)
            pending_scores.append(values)
            pending_idx.append(columns + c0)
            if sum(p.shape[1] for p in pending_idx) >= corpus_block + k or c0 + corpus_block >= n:
                best, best_idx = _merge(torch.cat(pending_scores, dim=1),
                                        torch.cat(pending_idx, dim=1), tie_rank, k)
                pending_scores, pending_idx = [best], [best_idx]
        out_scores.append(pending_scores[0])
        out_indices.append(pending_idx[0])
    if not out_scores:
        empty = queries.new_empty((0, k))
        return TopK(empty, torch.empty((0, k), dtype=torch.int64, device=queries.device))
    return TopK(torch.cat(out_scores), torch.cat(out_indices))


def _grades(relevance: Relevance, ranked: Tensor, num_docs: int) -> Tensor:
    """The grade of each ranked document, ``(Q, K)`` float64 (0 where it is not judged or is
    ``-1``), looked up in the sorted keys ``query * num_docs + doc`` (``relevance`` not empty)."""
    keys = relevance.query * num_docs + relevance.doc  # (R,)
    order = keys.argsort()
    keys, grades = keys[order], relevance.grade[order]
    queries = torch.arange(ranked.shape[0], dtype=torch.int64)[:, None]
    wanted = queries * num_docs + ranked.clamp(min=0)  # (Q, K)
    at = torch.searchsorted(keys, wanted).clamp(max=len(keys) - 1)
    found = (keys[at] == wanted) & (ranked >= 0)
    return torch.where(found, grades[at], 0.0)


def _ideal(judged: Relevance, rows: Tensor, num_rows: int, width: int) -> Tensor:
    """``(Q', width)`` float64: each query's grades, highest first, padded with zeros (the
    ranking of the ideal DCG); ``rows (R,)`` is each judgement's query row."""
    by_grade = torch.argsort(judged.grade, descending=True, stable=True)
    by_row = by_grade[torch.argsort(rows[by_grade], stable=True)]  # by row, then grade down
    rows_sorted, grades_sorted = rows[by_row], judged.grade[by_row]
    slot = torch.arange(len(rows_sorted)) - torch.searchsorted(rows_sorted, rows_sorted)
    ideal = torch.zeros(num_rows, width, dtype=torch.float64)
    inside = slot < width
    ideal[rows_sorted[inside], slot[inside]] = grades_sorted[inside]
    return ideal


def _check_relevance(where: str, relevance: Relevance, num_queries: int, num_docs: int) -> None:
    if not isinstance(relevance, Relevance):
        raise CrlTypeError(f"{where}: `relevance` must be a Relevance; got {describe(relevance)}")
    query, doc, grade = relevance
    if not (query.shape == doc.shape == grade.shape and query.dim() == 1):
        raise CrlValueError(f"{where}: `relevance` must hold three (R,) arrays; got shapes "
                            f"{tuple(query.shape)}, {tuple(doc.shape)}, {tuple(grade.shape)}")
    for name, ids, size in (("query", query, num_queries), ("doc", doc, num_docs)):
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= size):
            raise CrlValueError(f"{where}: `relevance.{name}` must be in [0, {size}); got values "
                                f"from {int(ids.min())} to {int(ids.max())}")
    keys = query * num_docs + doc
    if len(keys) != len(torch.unique(keys)):
        raise CrlValueError(f"{where}: `relevance` judges some (query, doc) pair twice")


def ranking_metrics(ranked: Tensor, relevance: Relevance, *, num_docs: int,
                    ks: Sequence[int] = IR_KS) -> dict[str, float]:
    """nDCG@k, MRR@k, MAP@k, recall@k and precision@k of rankings (docs/evaluation.md).

    Args:
        ranked: ``(Q, K)`` int64 corpus positions, best first (``-1``: no document), with
            ``K >= max(ks)`` or the whole corpus.
        relevance: The judgements (query rows ``< Q``, doc rows ``< num_docs``).
        num_docs: The corpus size ``N``.
        ks: The cut-offs.

    Returns:
        ``ir/{ndcg,mrr,map,recall,precision}@k`` for each k, and ``ir/num_queries`` (the queries
        with a relevant document, over which every metric is averaged).

    Raises:
        CrlValueError: for bad ``ks``, judgements outside the queries or the corpus, or no
            query with a relevant document.

    Example:
        >>> ranked = torch.tensor([[2, 0, 1]])  # the relevant document 0 comes second
        >>> m = ranking_metrics(ranked, Relevance.pairs(1), num_docs=3, ks=(1, 3))
        >>> m["ir/mrr@3"], m["ir/recall@1"], round(m["ir/ndcg@3"], 4)
        (0.5, 0.0, 0.6309)
    """
    where = "ranking_metrics"
    ks = _check_ks(where, ks)
    _check_relevance(where, relevance, ranked.shape[0], num_docs)
    relevance = Relevance(*(t.cpu() for t in relevance))
    positive = relevance.grade > 0
    judged = Relevance(relevance.query[positive], relevance.doc[positive],
                       relevance.grade[positive].double())
    num_relevant = torch.bincount(judged.query, minlength=ranked.shape[0])  # (Q,)
    keep = num_relevant > 0
    if not bool(keep.any()):
        raise CrlValueError(f"{where}: no query has a relevant document (grade > 0)")
    width = min(ranked.shape[1], max(ks))
    grades = _grades(judged, ranked[:, :width].cpu(), num_docs)[keep]  # (Q', K)
    hits = (grades > 0).double()
    num_rel = num_relevant[keep].double()  # (Q',)
    positions = torch.arange(1, width + 1, dtype=torch.float64)  # 1-based ranks
    discount = 1.0 / torch.log2(positions + 1)  # (K,)
    rows = torch.cumsum(keep.long(), 0)[judged.query] - 1  # row of each judgement in Q'
    ideal = _ideal(judged, rows, int(keep.sum()), width)  # (Q', K)
    hits_so_far = hits.cumsum(dim=1)  # (Q', K)
    first_hit = torch.where(hits > 0, positions, torch.inf).min(dim=1).values  # (Q',)
    out: dict[str, float] = {}
    for k in ks:
        c = min(k, width)
        dcg = (grades[:, :c] * discount[:c]).sum(dim=1)
        idcg = (ideal[:, :c] * discount[:c]).sum(dim=1)
        out[f"ir/ndcg@{k}"] = float((dcg / idcg).mean())
        out[f"ir/mrr@{k}"] = float(torch.where(first_hit <= k, 1.0 / first_hit, 0.0).mean())
        precision_sum = (hits[:, :c] * hits_so_far[:, :c] / positions[:c]).sum(dim=1)
        out[f"ir/map@{k}"] = float((precision_sum / num_rel.clamp(max=k)).mean())
        found = hits_so_far[:, c - 1]
        out[f"ir/recall@{k}"] = float((found / num_rel).mean())
        out[f"ir/precision@{k}"] = float((found / k).mean())
    out["ir/num_queries"] = float(keep.sum())
    return out


def ir_metrics(queries: Tensor, corpus: Tensor, relevance: Relevance, *,
               ks: Sequence[int] = IR_KS, tie_rank: Tensor | None = None,
               query_block: int = 1024, corpus_block: int = 16384) -> dict[str, float]:
    """nDCG@k, MRR@k, MAP@k, recall@k and precision@k of embeddings with relevance judgements:
    :func:`top_k` to ``max(ks)``, then :func:`ranking_metrics`.

    Args:
        queries: ``(Q, D)`` query embeddings.
        corpus: ``(N, D)`` document embeddings.
        relevance: The judgements, by row of ``queries`` and ``corpus``.
        ks: The cut-offs (each ``>= 1``).
        tie_rank: ``(N,)`` int64 order of tied documents (None: corpus position).
        query_block, corpus_block: Block sizes of :func:`top_k`.

    Returns:
        See :func:`ranking_metrics`.

    Example:
        >>> q = torch.eye(2); c = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
        >>> ir_metrics(q, c, Relevance.pairs(2), ks=(1,))["ir/ndcg@1"]
        0.0
    """
    ks = _check_ks("ir_metrics", ks)
    ranked = top_k(queries, corpus, max(ks), tie_rank=tie_rank, query_block=query_block,
                   corpus_block=corpus_block).indices
    return ranking_metrics(ranked, relevance, num_docs=corpus.shape[0], ks=ks)


__all__ = ["IR_KS", "IR_METRICS", "Relevance", "TopK", "ir_metrics", "ranking_metrics", "top_k"]
