"""Exact top-``k`` inner-product search of queries over a corpus, blockwise: a running top-``k``
over corpus blocks for each block of queries, so memory is ``O(Q_b C_b + Q k)``, never
``Q x N``; or faiss's exact ``IndexFlatIP`` when it is installed. Both return the same
candidates up to ties and rounding (tested)."""

from __future__ import annotations

import importlib.util
from typing import Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor

from crl.errors import CrlValueError

#: ``backend`` of :func:`top_candidates`: faiss when installed (``"auto"``), or either.
Backend = Literal["auto", "torch", "faiss"]
#: Scores built at once by the torch path: a ``(Q_b, C_b)`` block of at most this many.
BLOCK_ENTRIES = 1 << 24


class Candidates(NamedTuple):
    """Each query's ``k`` best corpus entries, best first.

    Attributes:
        scores: ``(Q, k)`` float32 inner products; ``-inf`` where the corpus has fewer than
            ``k`` entries.
        indices: ``(Q, k)`` int64 corpus rows; ``-1`` where the corpus has fewer than ``k``.
    """

    scores: Tensor
    indices: Tensor


def faiss_available() -> bool:
    """Whether ``faiss`` can be imported."""
    return importlib.util.find_spec("faiss") is not None


def _pad(scores: Tensor, indices: Tensor, k: int) -> Candidates:
    missing = k - scores.shape[1]
    if missing > 0:  # a corpus smaller than k, as sentence-transformers pads
        scores = torch.cat([scores, scores.new_full((scores.shape[0], missing), -torch.inf)], 1)
        indices = torch.cat([indices, indices.new_full((indices.shape[0], missing), -1)], 1)
    return Candidates(scores, indices)


def _torch_top(queries: Tensor, corpus: Tensor, k: int, block: int) -> Candidates:
    n = corpus.shape[0]
    kk = min(k, n)
    q_block = max(1, min(queries.shape[0], BLOCK_ENTRIES // max(1, min(block, n))))
    scores_out, indices_out = [], []
    for q0 in range(0, queries.shape[0], q_block):
        q = queries[q0:q0 + q_block]  # (Q_b, D)
        best_s = q.new_empty(q.shape[0], 0)
        best_i = torch.empty(q.shape[0], 0, dtype=torch.long)
        for c0 in range(0, n, block):
            s = q @ corpus[c0:c0 + block].T  # (Q_b, C_b)
            s, i = torch.topk(s, min(kk, s.shape[1]), dim=1)
            # The running top-k: the best so far (lower corpus rows) first, a stable sort, so
            # equal scores keep the lower row first.
            best_s, order = torch.sort(torch.cat([best_s, s], 1), dim=1, descending=True,
                                       stable=True)
            best_i = torch.cat([best_i, i + c0], 1).gather(1, order)
            best_s, best_i = best_s[:, :kk], best_i[:, :kk]
        scores_out.append(best_s)
        indices_out.append(best_i)
    return _pad(torch.cat(scores_out), torch.cat(indices_out), k)


def _faiss_top(queries: Tensor, corpus: Tensor, k: int, block: int) -> Candidates:
    import faiss

    index = faiss.IndexFlatIP(corpus.shape[1])
    index.add(np.ascontiguousarray(corpus.numpy(), dtype=np.float32))
    kk = min(k, corpus.shape[0])
    scores_out, indices_out = [], []
    for q0 in range(0, queries.shape[0], block):
        s, i = index.search(np.ascontiguousarray(queries[q0:q0 + block].numpy()), kk)
        scores_out.append(torch.from_numpy(s))
        indices_out.append(torch.from_numpy(i).long())
    return _pad(torch.cat(scores_out), torch.cat(indices_out), k)


def top_candidates(queries: Tensor, corpus: Tensor, k: int, *, backend: Backend = "auto",
                   block: int = 16384) -> Candidates:
    """The ``k`` corpus rows of largest inner product with each query, best first.

    Args:
        queries: ``(Q, D)`` float32.
        corpus: ``(N, D)`` float32.
        k: Candidates per query (``>= 1``; more than ``N`` are padded).
        backend: ``"torch"`` (blockwise running top-k), ``"faiss"`` (exact ``IndexFlatIP``) or
            ``"auto"`` (faiss when installed).
        block: Corpus rows per block (torch) or queries per search call (faiss).

    Returns:
        :class:`Candidates` ``(scores (Q, k), indices (Q, k))``.

    Raises:
        CrlValueError: for ``k < 1``, mismatched dimensions, an unknown backend, or
            ``"faiss"`` when it is not installed.

    Example:
        >>> corpus = torch.eye(3)
        >>> out = top_candidates(torch.tensor([[0.0, 1.0, 0.5]]), corpus, 2, backend="torch")
        >>> out.indices.tolist(), out.scores.tolist()
        ([[1, 2]], [[1.0, 0.5]])
    """
    if k < 1:
        raise CrlValueError(f"top_candidates: `k` must be >= 1; got {k}")
    if queries.dim() != 2 or corpus.dim() != 2 or queries.shape[1] != corpus.shape[1]:
        raise CrlValueError(f"top_candidates: `queries` (Q, D) and `corpus` (N, D) must share "
                            f"D; got {tuple(queries.shape)} and {tuple(corpus.shape)}")
    if backend not in ("auto", "torch", "faiss"):
        raise CrlValueError(f"top_candidates: `backend` must be 'auto', 'torch' or 'faiss'; "
                            f"got {backend!r}")
    if backend == "faiss" and not faiss_available():
        raise CrlValueError("top_candidates: backend 'faiss' needs the package faiss-cpu "
                            "(pip install faiss-cpu); or use backend 'torch'")
    queries, corpus = queries.float().contiguous(), corpus.float().contiguous()
    if backend == "faiss" or (backend == "auto" and faiss_available()):
        return _faiss_top(queries, corpus, k, block)
    return _torch_top(queries, corpus, k, block)


__all__ = ["Backend", "Candidates", "faiss_available", "top_candidates"]
