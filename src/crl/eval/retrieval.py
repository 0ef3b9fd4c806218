"""Retrieval metrics on score matrices, computed over tiles of scores (docs/theory.md §11).

Conventions (used by every function here):

- ``a[i]`` and ``b[i]`` are a positive pair; every other candidate is a negative.
- The **rank** of the positive is ``1 + #{negatives scored >= the positive}``: rank 1 is best and a
  tie counts against the positive, so a collapsed encoder (all scores equal) gets the worst rank
  and recall, never a lucky one.
- The **AUC criterion** of a query is the fraction of negatives scored below its positive, ties
  counting one half; with several positives, the fraction of (positive, negative) pairs ordered
  correctly (the Mann-Whitney statistic).
- **Average precision** follows scikit-learn's ``average_precision_score`` (tied scores form one
  threshold).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import NamedTuple

import torch
from torch import Tensor

from crl._validation import check_int_range, check_pair, check_tensor, compute_dtype, describe
from crl.errors import CrlTypeError, CrlValueError

#: Default cut-offs of ``recall@k``.
DEFAULT_KS: tuple[int, ...] = (1, 5, 10)


def _check_ks(where: str, ks: Sequence[int]) -> tuple[int, ...]:
    if isinstance(ks, (str, bytes)) or not isinstance(ks, Sequence) or len(ks) == 0:
        raise CrlTypeError(
            f"{where}: `ks` must be a non-empty sequence of ints; got {describe(ks)}"
        )
    for k in ks:
        check_int_range(where, "ks[...]", k, 1, None)
    return tuple(int(k) for k in ks)


#: Counts are sums of 0/1 floats, exact in float32 up to 2**24 terms (a float64 mask beyond).
_FLOAT32_EXACT_COUNT = 2**24
#: Below this many scores the tiles are counted in the calling thread (a thread pool costs more).
_MIN_SCORES_FOR_WORKERS = 2**22


class _PairCounts(NamedTuple):
    """For each pair ``i``, negatives scored above / equal to the positive ``s_ii``, ``(N,)`` int64.

    ``x2y`` counts row ``i`` of ``S = a @ b.T`` (candidates ``b_j``), ``y2x`` column ``i``
    (candidates ``a_j``); the positive itself is not counted.
    """

    x2y_above: Tensor
    x2y_equal: Tensor
    y2x_above: Tensor
    y2x_equal: Tensor


class _TileCounter:
    """One worker's score and mask buffers, and its own counts (so workers never share a write).

    ``counts`` is ``(4, N)`` int64: x2y above, x2y equal, y2x above, y2x equal, with the positive
    itself included once in both "equal" rows for the diagonal tiles this worker counted.
    """

    def __init__(self, a: Tensor, b: Tensor, positive: Tensor, side: int) -> None:
        self.a, self.b, self.positive, self.side = a, b, positive, side
        mask_dtype = torch.float32 if side <= _FLOAT32_EXACT_COUNT else torch.float64
        self.score_buf = a.new_empty(side * side)
        self.mask_buf = torch.empty(side * side, dtype=mask_dtype, device=a.device)
        self.ones = torch.ones(side, dtype=mask_dtype, device=a.device)
        self.counts = torch.zeros(4, a.shape[0], dtype=torch.int64, device=a.device)

    def count(self, r0: int, c0: int) -> None:
        """Score the tile at rows ``r0:``, columns ``c0:`` and add its counts.

        A diagonal tile (``r0 == c0``) first records its diagonal as the positives of its pairs,
        so each positive is the value the product computed for it, not a separately rounded one.
        """
        n = self.a.shape[0]
        r1, c1 = min(r0 + self.side, n), min(c0 + self.side, n)
        rows, cols = r1 - r0, c1 - c0
        # Contiguous views of the flat buffers, so that each op writes into them directly.
        scores = torch.mm(self.a[r0:r1], self.b[c0:c1].T,
                          out=self.score_buf[: rows * cols].view(rows, cols))  # (rows, cols)
        if r0 == c0:
            self.positive[r0:r1] = scores.diagonal()
        mask = self.mask_buf[: rows * cols].view(rows, cols)
        row_pos, col_pos = self.positive[r0:r1, None], self.positive[None, c0:c1]
        x2y_above, x2y_equal, y2x_above, y2x_equal = self.counts
        torch.gt(scores, row_pos, out=mask)
        x2y_above[r0:r1] += torch.mv(mask, self.ones[:cols]).long()
        torch.eq(scores, row_pos, out=mask)
        x2y_equal[r0:r1] += torch.mv(mask, self.ones[:cols]).long()
        torch.gt(scores, col_pos, out=mask)
        y2x_above[c0:c1] += torch.mv(mask.T, self.ones[:rows]).long()
        torch.eq(scores, col_pos, out=mask)
        y2x_equal[c0:c1] += torch.mv(mask.T, self.ones[:rows]).long()


def _count_tiles(counters: list[_TileCounter], tiles: list[tuple[int, int]]) -> None:
    """Count ``tiles`` (``(r0, c0)`` corners) with one thread per counter, taking them in turn."""
    if len(counters) == 1:
        for r0, c0 in tiles:
            counters[0].count(r0, c0)
        return
    pending = iter(tiles)
    lock = threading.Lock()

    def work(counter: _TileCounter) -> None:
        while True:
            with lock:
                tile = next(pending, None)
            if tile is None:
                return
            counter.count(*tile)

    with ThreadPoolExecutor(max_workers=len(counters)) as pool:
        for done in [pool.submit(work, counter) for counter in counters]:
            done.result()  # re-raises a worker's error


@contextmanager
def _single_threaded_ops() -> Iterator[None]:
    """Run torch ops on one thread each while inside (restoring the thread count after).

    Workers counting their own tiles in parallel beat one tile at a time on all threads: no
    barrier per op (costly when other processes share the cores) and tiles that stay in cache.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _pair_counts(a: Tensor, b: Tensor, block_size: int) -> _PairCounts:
    """Count, in one pass over ``S = a @ b.T``, the negatives at or above each positive, both ways.

    ``S`` is scored in ``T x T`` tiles (``T = min(block_size, N)``), each exactly once: a tile's
    rows give the ``x2y`` counts of its queries, its columns the ``y2x`` counts of its candidates,
    so no pair is scored twice. The diagonal tiles go first: they hold every positive ``s_ii``,
    which the other tiles compare with. Counting is comparisons into a preallocated 0/1 float mask
    summed by a matrix-vector product (much faster than bool reductions). On CPU, with more than
    one torch thread, ``torch.get_num_threads()`` workers count tiles in parallel, each running
    single-threaded ops. Memory is ``O(T^2)`` per worker beyond the inputs.
    """
    n = a.shape[0]
    side = min(block_size, n)
    starts = range(0, n, side)
    positive = a.new_empty(n)  # s_ii, filled by the diagonal tiles
    workers = 1
    if a.device.type == "cpu" and n * n >= _MIN_SCORES_FOR_WORKERS:
        workers = max(1, min(torch.get_num_threads(), len(starts)))
    # Only the pool's workers need single-threaded ops; one counter keeps the caller's threads.
    threads: AbstractContextManager[None] = (
        _single_threaded_ops() if workers > 1 else nullcontext())
    with threads:
        counters = [_TileCounter(a, b, positive, side) for _ in range(workers)]
        _count_tiles(counters, [(s, s) for s in starts])  # every positive before any other tile
        _count_tiles(counters, [(r0, c0) for r0 in starts for c0 in starts if r0 != c0])
    counts = counters[0].counts
    for counter in counters[1:]:
        counts += counter.counts
    # Each positive equals itself exactly once in its row and once in its column.
    counts[1] -= 1
    counts[3] -= 1
    return _PairCounts(*counts)


def _ranks_and_aucs(above: Tensor, equal: Tensor, extra: int = 0) -> tuple[Tensor, Tensor]:
    """Ranks ``(N,)`` (int64) and AUC values ``(N,)`` (float64) from the counts of one direction,
    each query having ``N - 1 + extra`` negatives."""
    negatives = above.shape[0] - 1 + extra
    below = negatives - above - equal
    ranks = (1 + above + equal).cpu()  # ties count against the positive
    aucs = ((below.double() + 0.5 * equal.double()) / negatives).cpu()
    return ranks, aucs


def hard_negative_counts(a: Tensor, b: Tensor, hard: Tensor) -> tuple[Tensor, Tensor]:
    """For each query ``a_i``, its own hard negatives scored above / equal to its positive.

    The positive ``a_i . b_i`` and the hard scores ``a_i . h_ij`` are computed by the same
    reduction, so a hard negative identical to the positive ties with it exactly (and counts
    against it, as every tie does here).

    Args:
        a: ``(N, D)`` queries. b: ``(N, D)`` their positives. hard: ``(N, H, D)`` each query's
            ``H`` extra candidates (hard negatives in view-b form).

    Returns:
        ``(above, equal)``, each ``(N,)`` int64.

    Example:
        >>> a = torch.tensor([[1.0, 0.0]]); b = torch.tensor([[0.8, 0.6]])
        >>> hard_negative_counts(a, b, torch.tensor([[[0.9, 0.1], [0.8, 0.6], [0.0, 1.0]]]))
        (tensor([1]), tensor([1]))
    """
    positive = torch.einsum("nd,nhd->nh", a, b.unsqueeze(1))  # (N, 1)
    scores = torch.einsum("nd,nhd->nh", a, hard)  # (N, H)
    return (scores > positive).sum(dim=1), (scores == positive).sum(dim=1)


def retrieval_metrics(
    a: Tensor,
    b: Tensor,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    block_size: int = 1024,
    hard: Tensor | None = None,
) -> dict[str, float]:
    """Recall@k, AUC criterion and ranks of paired embeddings, in both directions.

    Scores are inner products ``s_ij = a_i . b_j`` (normalise the embeddings first for cosine).
    ``x2y`` ranks the ``b`` candidates for each query ``a_i``; ``y2x`` the ``a`` candidates for each
    ``b_i``. Every score is computed once, in ``block_size x block_size`` tiles of ``a @ b.T``
    whose rows serve ``x2y`` and whose columns serve ``y2x``, so memory is ``O(block_size^2)``
    beyond the inputs (about ``8 block_size^2`` bytes per worker thread in float32: 8 MiB at the
    default) and the result does not depend on ``block_size``. No top-k is needed: recall@k is
    ``rank <= k``.
    Time is one ``N x N x D`` product plus four comparisons per score. On CPU, for ``N^2 >= 2^22``,
    ``torch.get_num_threads()`` worker threads count tiles in parallel with single-threaded ops
    (the torch thread count is set to 1 during the call and restored after, like scikit-learn's
    ``threadpool_limits``): tiles then stay in cache and no op waits for a busy core.

    Args:
        a: ``(N, D)`` view-a embeddings.
        b: ``(N, D)`` view-b embeddings; ``b[i]`` is the positive of ``a[i]``.
        ks: The cut-offs of ``recall@k`` (each ``>= 1``; ``k >= N`` gives recall 1).
        block_size: Side of the square tiles of scores computed at once (``>= 1``).
        hard: ``(N, H, D)`` hard negatives: ``hard[i]`` are extra candidates of query ``a_i``
            only, in the ``x2y`` direction (which then ranks ``N + H`` candidates per query;
            :func:`hard_negative_counts`). None: none.

    Returns:
        ``retrieval/{x2y,y2x}_recall@k`` for each k, ``retrieval/{x2y,y2x}_auc``,
        ``retrieval/{x2y,y2x}_mean_rank`` and ``retrieval/{x2y,y2x}_median_rank`` as floats.

    Raises:
        CrlValueError: on shape mismatch, fewer than 2 pairs, NaN/Inf, or bad ``ks``/``block_size``.

    Example:
        >>> a = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> m = retrieval_metrics(a, a, ks=(1,))
        >>> m["retrieval/x2y_recall@1"]  # rows 0 and 1 tie their positive with a[2]
        0.3333333333333333
        >>> m["retrieval/x2y_auc"]
        0.8333333333333334
    """
    where = "retrieval_metrics"
    ks = _check_ks(where, ks)
    out: dict[str, float] = {}
    for name, (ranks, aucs) in _directions(where, a, b, block_size, hard).items():
        for k in ks:
            out[f"retrieval/{name}_recall@{k}"] = float((ranks <= k).double().mean())
        out[f"retrieval/{name}_auc"] = float(aucs.mean())
        out[f"retrieval/{name}_mean_rank"] = float(ranks.double().mean())
        out[f"retrieval/{name}_median_rank"] = float(ranks.double().quantile(0.5))
    return out


def _directions(where: str, a: Tensor, b: Tensor, block_size: int, hard: Tensor | None
                ) -> dict[str, tuple[Tensor, Tensor]]:
    """Checked inputs -> ``{"x2y": (ranks, aucs), "y2x": (ranks, aucs)}``, each ``(N,)``."""
    a, b = check_pair(where, a, b)
    check_int_range(where, "block_size", block_size, 1, None)
    dtype = compute_dtype(a, b)
    a, b = a.detach().to(dtype), b.detach().to(dtype)
    counts = _pair_counts(a, b, block_size)
    x2y_above, x2y_equal, extra = counts.x2y_above, counts.x2y_equal, 0
    if hard is not None:
        check_tensor(where, "hard", hard, ndim=3)
        if hard.shape[0] != a.shape[0] or hard.shape[2] != a.shape[1]:
            raise CrlValueError(f"{where}: `hard` must have shape ({a.shape[0]}, H, "
                                f"{a.shape[1]}); got {tuple(hard.shape)}")
        hard_above, hard_equal = hard_negative_counts(a, b, hard.detach().to(dtype))
        x2y_above, x2y_equal = x2y_above + hard_above, x2y_equal + hard_equal
        extra = int(hard.shape[1])
    return {"x2y": _ranks_and_aucs(x2y_above, x2y_equal, extra),
            "y2x": _ranks_and_aucs(counts.y2x_above, counts.y2x_equal, 0)}


def retrieval_ranks(a: Tensor, b: Tensor, *, block_size: int = 1024,
                    hard: Tensor | None = None) -> dict[str, Tensor]:
    """The rank of each query's positive, both ways: what :func:`retrieval_metrics` averages.

    Same scores, tiles, tie rule (a tie counts against the positive) and ``hard`` as
    :func:`retrieval_metrics`; for comparing two models query by query on the same pairs.

    Args:
        a: ``(N, D)`` view-a embeddings.
        b: ``(N, D)`` view-b embeddings; ``b[i]`` is the positive of ``a[i]``.
        block_size: Side of the square tiles of scores computed at once (``>= 1``).
        hard: ``(N, H, D)`` hard negatives of the ``x2y`` queries, or None.

    Returns:
        ``{"x2y": (N,) int64, "y2x": (N,) int64}``, ranks from 1 (best).

    Example:
        >>> a = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> retrieval_ranks(a, a)["x2y"].tolist()  # rows 0 and 1 tie their positive with a[2]
        [2, 2, 1]
    """
    return {name: ranks for name, (ranks, _) in
            _directions("retrieval_ranks", a, b, block_size, hard).items()}


__all__ = ["DEFAULT_KS", "retrieval_metrics", "retrieval_ranks"]
