"""Retrieval metrics on score matrices, computed over blocks of queries (THEORY.md section 4).

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

from collections.abc import Sequence

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


def _direction_stats(queries: Tensor, candidates: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
    """Ranks ``(N,)`` (int64) and AUC values ``(N,)`` (float64) of query ``i``'s positive ``i``.

    Memory is ``O(block_size x N)``: one block of query rows is scored at a time.
    """
    n = queries.shape[0]
    ranks = torch.empty(n, dtype=torch.int64)
    aucs = torch.empty(n, dtype=torch.float64)
    for start in range(0, n, block_size):
        stop = min(start + block_size, n)
        scores = queries[start:stop] @ candidates.T  # (Q, N)
        rows = torch.arange(stop - start, device=scores.device)
        positive = scores[rows, rows + start].unsqueeze(1)  # (Q, 1)
        # The positive itself is counted once in `ge` and once in `eq`: take it out of both.
        above = torch.count_nonzero(scores > positive, dim=1)  # no int64 copy of the block
        equal = torch.count_nonzero(scores == positive, dim=1) - 1
        below = n - 1 - above - equal
        ranks[start:stop] = (1 + above + equal).cpu()
        aucs[start:stop] = ((below.double() + 0.5 * equal.double()) / (n - 1)).cpu()
    return ranks, aucs


def retrieval_metrics(
    a: Tensor,
    b: Tensor,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    block_size: int = 4096,
) -> dict[str, float]:
    """Recall@k, AUC criterion and ranks of paired embeddings, in both directions.

    Scores are inner products ``s_ij = a_i . b_j`` (normalise the embeddings first for cosine).
    ``x2y`` ranks the ``b`` candidates for each query ``a_i``; ``y2x`` the ``a`` candidates for each
    ``b_i``. Only ``block_size`` query rows are scored at a time, so memory is
    ``O(block_size x N)``; the result does not depend on ``block_size``.

    Args:
        a: ``(N, D)`` view-a embeddings.
        b: ``(N, D)`` view-b embeddings; ``b[i]`` is the positive of ``a[i]``.
        ks: The cut-offs of ``recall@k`` (each ``>= 1``; ``k >= N`` gives recall 1).
        block_size: Query rows scored at once (``>= 1``).

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
    a, b = check_pair(where, a, b)
    ks = _check_ks(where, ks)
    check_int_range(where, "block_size", block_size, 1, None)
    dtype = compute_dtype(a, b)
    a, b = a.detach().to(dtype), b.detach().to(dtype)
    out: dict[str, float] = {}
    for name, queries, candidates in (("x2y", a, b), ("y2x", b, a)):
        ranks, aucs = _direction_stats(queries, candidates, block_size)
        for k in ks:
            out[f"retrieval/{name}_recall@{k}"] = float((ranks <= k).double().mean())
        out[f"retrieval/{name}_auc"] = float(aucs.mean())
        out[f"retrieval/{name}_mean_rank"] = float(ranks.double().mean())
        out[f"retrieval/{name}_median_rank"] = float(ranks.double().quantile(0.5))
    return out


def _check_scores_positives(where: str, scores: Tensor, positives: Tensor) -> Tensor:
    scores = check_tensor(where, "scores", scores, ndim=2)
    if not isinstance(positives, Tensor) or positives.dtype != torch.bool:
        raise CrlTypeError(f"{where}: `positives` must be a bool tensor; got {describe(positives)}")
    if positives.shape != scores.shape:
        raise CrlValueError(
            f"{where}: `positives` must have the shape of `scores` {tuple(scores.shape)}; "
            f"got {tuple(positives.shape)}"
        )
    count = positives.sum(dim=1)
    no_pos = (count == 0).nonzero().flatten()
    if no_pos.numel() > 0:
        raise CrlValueError(
            f"{where}: every query needs at least one positive; {no_pos.numel()} row(s) have "
            f"none (first: {[int(i) for i in no_pos[:5]]})"
        )
    return scores.detach().to(torch.float64)


def auc_criterion(scores: Tensor, positives: Tensor) -> Tensor:
    """Per-query AUC criterion: the fraction of (positive, negative) pairs with the positive
    scored higher, ties counting one half (THEORY.md section 4).

    Computed from mid-ranks (the Mann-Whitney U statistic), ``O(Q K log K)``.

    Args:
        scores: ``(Q, K)`` scores of K candidates for Q queries.
        positives: ``(Q, K)`` bool, True where the candidate is a positive of the query (several
            per query allowed); every row needs a positive and a negative.

    Returns:
        ``(Q,)`` float64 values in ``[0, 1]``.

    Raises:
        CrlValueError: if a row has no positive or no negative, or on shape mismatch.

    Example:
        >>> s = torch.tensor([[0.9, 0.5, 0.5, 0.1]])
        >>> auc_criterion(s, torch.tensor([[False, True, False, False]]))
        tensor([0.5000], dtype=torch.float64)
    """
    where = "auc_criterion"
    scores = _check_scores_positives(where, scores, positives)
    num_pos = positives.sum(dim=1)
    num_neg = positives.shape[1] - num_pos
    no_neg = (num_neg == 0).nonzero().flatten()
    if no_neg.numel() > 0:
        raise CrlValueError(
            f"{where}: every query needs at least one negative; {no_neg.numel()} row(s) have "
            f"none (first: {[int(i) for i in no_neg[:5]]})"
        )
    ordered = scores.sort(dim=1).values  # (Q, K)
    less = torch.searchsorted(ordered, scores, right=False)  # (Q, K) entries strictly below
    less_equal = torch.searchsorted(ordered, scores, right=True)
    midrank = 0.5 * (less + less_equal + 1).double()  # 1-based, ties share the mean rank
    pos = num_pos.double()
    u = (midrank * positives).sum(dim=1) - pos * (pos + 1) / 2
    return u / (pos * num_neg.double())


def average_precision(scores: Tensor, positives: Tensor) -> Tensor:
    """Per-query average precision; its mean over queries is the mAP.

    ``AP = (1/P) sum_{p positive} precision(s >= s_p)``: tied scores form one threshold, as in
    scikit-learn's ``average_precision_score``.

    Args:
        scores: ``(Q, K)`` scores.
        positives: ``(Q, K)`` bool, several positives per query allowed (at least one).

    Returns:
        ``(Q,)`` float64 values in ``(0, 1]``.

    Example:
        >>> s = torch.tensor([[0.9, 0.8, 0.1]])
        >>> average_precision(s, torch.tensor([[False, True, True]]))  # (1/2 + 2/3) / 2
        tensor([0.5833], dtype=torch.float64)
    """
    where = "average_precision"
    scores = _check_scores_positives(where, scores, positives)
    k = scores.shape[1]
    ordered = scores.sort(dim=1).values
    at_least = k - torch.searchsorted(ordered, scores, right=False)  # (Q, K) #{s >= s_j}
    pos_only = scores.masked_fill(~positives, float("-inf")).sort(dim=1).values
    pos_at_least = k - torch.searchsorted(pos_only, scores, right=False)  # #{positive s >= s_j}
    precision = pos_at_least.double() / at_least.double()
    return (precision * positives).sum(dim=1) / positives.sum(dim=1).double()


def mean_average_precision(scores: Tensor, positives: Tensor) -> float:
    """The mean over queries of :func:`average_precision`.

    Example:
        >>> s = torch.tensor([[0.9, 0.8, 0.1], [0.1, 0.2, 0.3]])
        >>> p = torch.tensor([[True, False, False], [False, False, True]])
        >>> mean_average_precision(s, p)
        1.0
    """
    return float(average_precision(scores, positives).mean())


__all__ = [
    "DEFAULT_KS",
    "auc_criterion",
    "average_precision",
    "mean_average_precision",
    "retrieval_metrics",
]
