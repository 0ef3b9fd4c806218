"""One tie rule (docs/theory.md §11): a tie counts against the positive in retrieval ranks,
zero-shot classification and the kNN vote; the median rank of an even count is the mean of the
two middle ranks."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crl.eval import knn_probe, retrieval_metrics, zero_shot
from crl.eval.probes import pessimistic_predictions


def test_collapsed_class_embeddings_score_nothing() -> None:
    features = torch.randn(12, 4)
    labels = torch.tensor([0] * 9 + [1] * 3)  # argmax would score 9/12 (the frequency of class 0)
    result = zero_shot(features, torch.ones(2, 4), labels)
    assert (result.accuracy, result.balanced_accuracy) == (0.0, 0.0)


def test_a_tie_with_another_class_is_a_miss_and_a_strict_win_a_hit() -> None:
    scores = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 2.0, 1.0], [3.0, 1.0, 3.0]])
    target = torch.tensor([0, 1, 1, 1])
    assert pessimistic_predictions(scores, target).tolist() == [1, 0, 1, 0]


def test_a_tied_knn_vote_is_a_miss() -> None:
    # Two training items with identical features and different classes: every vote ties.
    train_x, train_y = torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([0, 1])
    test_x, test_y = torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([0, 1])
    assert knn_probe(train_x, train_y, test_x, test_y, k=2).accuracy == 0.0
    # A third item breaks the tie for class 0 only.
    more_x, more_y = torch.cat([train_x, torch.tensor([[1.0, 0.0]])]), torch.tensor([0, 1, 0])
    assert knn_probe(more_x, more_y, test_x, test_y, k=3).accuracy == 0.5


def test_collapsed_encoder_gets_the_worst_rank() -> None:
    n = 6
    m = retrieval_metrics(torch.ones(n, 3), torch.ones(n, 3), ks=(1,))
    for name in ("x2y", "y2x"):
        assert m[f"retrieval/{name}_recall@1"] == 0.0
        assert m[f"retrieval/{name}_mean_rank"] == n == m[f"retrieval/{name}_median_rank"]
        assert m[f"retrieval/{name}_auc"] == 0.5  # the AUC criterion counts a tie one half


def test_median_rank_of_an_even_count_is_the_mean_of_the_middle_two() -> None:
    # With a = I, s_ij = b_j[i]: b = S.T gives the score matrix S, whose rows rank their
    # positive (the diagonal) 1, 1, 2 and 3.
    scores = torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 1, 0], [0, 2, 3, 1]])
    m = retrieval_metrics(torch.eye(4), scores.T, ks=(1,))
    assert m["retrieval/x2y_mean_rank"] == 7 / 4
    assert m["retrieval/x2y_median_rank"] == 1.5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=2, max_size=8),
       st.lists(st.integers(0, 2), min_size=8, max_size=8))
def test_zero_shot_and_recall_at_1_use_the_same_rule(rows_a: list[int], rows_b: list[int]) -> None:
    # Items and "classes" drawn from three basis vectors: exact ties in any precision. With one
    # class per item, zero-shot accuracy is recall@1 of the items against the class embeddings.
    n = len(rows_a)
    basis = torch.eye(3)
    a, b = basis[rows_a], basis[rows_b[:n]]
    recall = retrieval_metrics(a, b, ks=(1,))["retrieval/x2y_recall@1"]
    assert zero_shot(a, b, torch.arange(n)).accuracy == recall


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=3, max_size=9), st.integers(1, 4),
       st.integers(0, 2))
def test_retrieval_ranks_are_the_ranks_retrieval_metrics_averages(
        rows: list[int], block: int, hard_count: int) -> None:
    """Per-query ranks against a loop from the definition (1 + candidates scored at least the
    positive, ties against it), with tiles and hard negatives; their means are the metrics."""
    from crl.eval import retrieval_ranks

    a = torch.nn.functional.one_hot(torch.tensor(rows), 4).double()  # many exact ties
    b = a.flip(0) + 0.5 * a
    hard = a[:, None, :].repeat(1, hard_count, 1) if hard_count else None
    got = retrieval_ranks(a, b, block_size=block, hard=hard)
    s = a @ b.T
    for name, scores, extra in (("x2y", s, hard), ("y2x", s.T, None)):
        want = []
        for i in range(len(rows)):
            others = [scores[i, j] for j in range(len(rows)) if j != i]
            if extra is not None:
                others += [a[i] @ extra[i, k] for k in range(extra.shape[1])]
            want.append(1 + sum(bool(o >= scores[i, i]) for o in others))
        assert got[name].tolist() == want
    metrics = retrieval_metrics(a, b, ks=(1, 2), block_size=block, hard=hard)
    for name in ("x2y", "y2x"):
        for k in (1, 2):
            assert metrics[f"retrieval/{name}_recall@{k}"] == float(
                (got[name] <= k).double().mean())
        assert metrics[f"retrieval/{name}_mean_rank"] == float(got[name].double().mean())
