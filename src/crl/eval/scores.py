"""Ranking metrics on a full score matrix with several positives per query: the AUC criterion
and average precision (docs/theory.md §11; the conventions of :mod:`crl.eval.retrieval`: ties
count against the positive for ranks, one half for the AUC, one threshold for average precision,
as scikit-learn's ``average_precision_score``)."""

from __future__ import annotations

import torch
from torch import Tensor

from crl._validation import check_tensor, describe
from crl.errors import CrlTypeError, CrlValueError


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
    scored higher, ties counting one half (docs/theory.md §11).

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


__all__ = ["auc_criterion", "average_precision", "mean_average_precision"]
