"""Retrieval metrics against brute-force references written from the definitions."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, roc_auc_score

from crl.errors import CrlTypeError, CrlValueError
from crl.eval import auc_criterion, average_precision, mean_average_precision, retrieval_metrics


def _reference(a: torch.Tensor, b: torch.Tensor, ks: tuple[int, ...]) -> dict[str, float]:
    """Python loops over every query and candidate, exactly the documented definitions."""
    out: dict[str, float] = {}
    s = (a.double() @ b.double().T).tolist()
    n = len(s)
    for name, scores in (("x2y", s), ("y2x", [list(col) for col in zip(*s, strict=True)])):
        ranks, aucs = [], []
        for i in range(n):
            pos = scores[i][i]
            others = [scores[i][j] for j in range(n) if j != i]
            ranks.append(1 + sum(1 for v in others if v >= pos))
            aucs.append(sum(1.0 if v < pos else 0.5 if v == pos else 0.0 for v in others)
                        / len(others))
        for k in ks:
            out[f"retrieval/{name}_recall@{k}"] = sum(r <= k for r in ranks) / n
        out[f"retrieval/{name}_auc"] = sum(aucs) / n
        out[f"retrieval/{name}_mean_rank"] = sum(ranks) / n
        out[f"retrieval/{name}_median_rank"] = float(statistics.median(ranks))
    return out


def _assert_close(got: dict[str, float], want: dict[str, float]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-12), key


@pytest.mark.parametrize("block_size", [1, 3, 7, 4096])
def test_matches_reference_with_ties_and_blocks(block_size: int) -> None:
    # Small integer embeddings make many exact ties; 23 rows is not a multiple of 3 or 7.
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-1, 2, (23, 3), generator=gen).double()
    b = torch.randint(-1, 2, (23, 3), generator=gen).double()
    ks = (1, 2, 5, 30)
    got = retrieval_metrics(a, b, ks=ks, block_size=block_size)
    _assert_close(got, _reference(a, b, ks))
    assert got["retrieval/x2y_recall@30"] == 1.0


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 12), d=st.integers(1, 4), block=st.integers(1, 13),
       seed=st.integers(0, 10_000))
def test_matches_reference_property(n: int, d: int, block: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(-2, 3, (n, d), generator=gen).float()
    b = torch.randint(-2, 3, (n, d), generator=gen).float()
    _assert_close(retrieval_metrics(a, b, ks=(1, 3), block_size=block), _reference(a, b, (1, 3)))


def test_perfect_and_collapsed_encoders() -> None:
    eye = torch.eye(6)
    perfect = retrieval_metrics(eye, eye, ks=(1,))
    assert perfect["retrieval/x2y_recall@1"] == 1.0 and perfect["retrieval/y2x_auc"] == 1.0
    assert perfect["retrieval/x2y_median_rank"] == 1.0
    collapsed = retrieval_metrics(torch.ones(6, 2), torch.ones(6, 2), ks=(1,))
    # Ties count against the positive for ranks and one half for the AUC.
    assert collapsed["retrieval/x2y_recall@1"] == 0.0
    assert collapsed["retrieval/x2y_mean_rank"] == 6.0
    assert collapsed["retrieval/x2y_auc"] == 0.5


def test_directions_are_transposes() -> None:
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(17, 4, generator=gen), torch.randn(17, 4, generator=gen)
    ab, ba = retrieval_metrics(a, b), retrieval_metrics(b, a)
    for key, value in ab.items():
        assert ba[key.replace("x2y", "tmp").replace("y2x", "x2y").replace("tmp", "y2x")] == value


def test_retrieval_bad_input() -> None:
    with pytest.raises(CrlValueError, match="same shape"):
        retrieval_metrics(torch.randn(4, 2), torch.randn(5, 2))
    with pytest.raises(CrlValueError, match="block_size"):
        retrieval_metrics(torch.randn(4, 2), torch.randn(4, 2), block_size=0)
    with pytest.raises(CrlValueError, match="ks"):
        retrieval_metrics(torch.randn(4, 2), torch.randn(4, 2), ks=(0,))
    with pytest.raises(CrlTypeError, match="ks"):
        retrieval_metrics(torch.randn(4, 2), torch.randn(4, 2), ks=5)  # type: ignore[arg-type]
    with pytest.raises(CrlValueError, match="finite"):
        retrieval_metrics(torch.full((4, 2), float("nan")), torch.randn(4, 2))


def _random_scores_and_positives(seed: int, q: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 4, (q, k), generator=gen).double()  # many ties
    positives = torch.rand(q, k, generator=gen) < 0.3
    positives[:, 0] = True  # at least one positive
    positives[:, 1] = False  # at least one negative
    return scores, positives


def test_auc_criterion_matches_sklearn_and_pairs() -> None:
    scores, positives = _random_scores_and_positives(0, 30, 11)
    got = auc_criterion(scores, positives)
    for i in range(scores.shape[0]):
        want = roc_auc_score(positives[i].numpy(), scores[i].numpy())
        assert float(got[i]) == pytest.approx(want, abs=1e-12)
        # the pair-counting definition of docs/theory.md §11
        pos = scores[i][positives[i]].tolist()
        neg = scores[i][~positives[i]].tolist()
        pairs = [1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg]
        assert float(got[i]) == pytest.approx(sum(pairs) / len(pairs), abs=1e-12)


def test_auc_criterion_agrees_with_retrieval_metrics() -> None:
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randint(-1, 2, (15, 3), generator=gen).float(), torch.randn(15, 3, generator=gen)
    per_query = auc_criterion(a @ b.T, torch.eye(15, dtype=torch.bool))
    assert float(per_query.mean()) == pytest.approx(
        retrieval_metrics(a, b, block_size=4)["retrieval/x2y_auc"], abs=1e-12)


def test_average_precision_matches_sklearn() -> None:
    scores, positives = _random_scores_and_positives(3, 40, 9)
    got = average_precision(scores, positives)
    for i in range(scores.shape[0]):
        want = average_precision_score(positives[i].numpy(), scores[i].numpy())
        assert float(got[i]) == pytest.approx(want, abs=1e-12)
    assert mean_average_precision(scores, positives) == pytest.approx(float(got.mean()))


def test_average_precision_distinct_scores_by_hand() -> None:
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.7]])
    positives = torch.tensor([[True, False, True, False]])
    # ranking: 0.9 (neg), 0.7 (neg), 0.5 (pos: precision 1/3), 0.1 (pos: precision 2/4)
    assert float(average_precision(scores, positives)[0]) == pytest.approx((1 / 3 + 2 / 4) / 2)


def test_score_matrix_errors() -> None:
    with pytest.raises(CrlValueError, match="at least one positive"):
        auc_criterion(torch.zeros(2, 3), torch.tensor([[True, False, False], [False] * 3]))
    with pytest.raises(CrlValueError, match="at least one negative"):
        auc_criterion(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(CrlTypeError, match="bool"):
        average_precision(torch.zeros(1, 2), torch.ones(1, 2))
    with pytest.raises(CrlValueError, match="shape"):
        average_precision(torch.zeros(1, 2), torch.ones(1, 3, dtype=torch.bool))
    assert np.isfinite(float(auc_criterion(torch.zeros(1, 2), torch.tensor([[True, False]]))[0]))


def _vectorized_reference(a: torch.Tensor, b: torch.Tensor,
                          ks: tuple[int, ...]) -> dict[str, float]:
    """The definitions on one full float64 score matrix, with broadcasting instead of loops."""
    s = a.double() @ b.double().T
    n = s.shape[0]
    off = ~torch.eye(n, dtype=torch.bool)
    out: dict[str, float] = {}
    for name, scores in (("x2y", s), ("y2x", s.T)):
        pos = scores.diagonal()[:, None]
        above_or_tied = ((scores >= pos) & off).sum(1)
        below = ((scores < pos) & off).sum(1)
        tied = ((scores == pos) & off).sum(1)
        ranks = (1 + above_or_tied).double()
        for k in ks:
            out[f"retrieval/{name}_recall@{k}"] = float((ranks <= k).double().mean())
        out[f"retrieval/{name}_auc"] = float(((below.double() + 0.5 * tied.double())
                                              / (n - 1)).mean())
        out[f"retrieval/{name}_mean_rank"] = float(ranks.mean())
        out[f"retrieval/{name}_median_rank"] = float(statistics.median(ranks.tolist()))
    return out


@pytest.mark.parametrize("block_size", [7, 64, 99, 100, 350, 4096])
def test_continuous_scores_match_reference_over_tiles(block_size: int) -> None:
    # 350 pairs: block sizes that divide it, do not, equal it and exceed it.
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(350, 8, generator=gen, dtype=torch.float64)
    b = a + torch.randn(350, 8, generator=gen, dtype=torch.float64)
    ks = (1, 5, 10)
    got = retrieval_metrics(a, b, ks=ks, block_size=block_size)
    want = _vectorized_reference(a, b, ks)
    _assert_close(got, want)
    assert 0.0 < want["retrieval/x2y_recall@1"] < 1.0  # neither trivial nor hopeless


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 40), block=st.integers(1, 45), seed=st.integers(0, 10_000))
def test_dyadic_ties_across_tiles_property(n: int, block: int, seed: int) -> None:
    # Halves are exact in float32, so scores (and their ties) are the same in any summation order;
    # copies of positives land in other tiles than the positive itself.
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(-2, 3, (n, 3), generator=gen).float() / 2
    b = torch.randint(-2, 3, (n, 3), generator=gen).float() / 2
    j = torch.randint(0, n, (n // 3,), generator=gen)
    b[torch.randint(0, n, (n // 3,), generator=gen)] = b[j]
    a[torch.randint(0, n, (n // 3,), generator=gen)] = a[j]
    _assert_close(retrieval_metrics(a, b, ks=(1, 2), block_size=block), _reference(a, b, (1, 2)))


@pytest.mark.parametrize("block_size", [2, 3, 5, 12])
def test_duplicate_of_the_positive_ties_with_it(block_size: int) -> None:
    # A perfect encoder on continuous float32 embeddings, except that candidate b[9] is a copy of
    # b[2] (in another tile than the positive s_22 for small blocks). The copy must tie with the
    # positive and count against it: query 2 drops to rank 2, query 9 lost its positive.
    gen = torch.Generator().manual_seed(5)
    a = torch.nn.functional.normalize(torch.randn(12, 6, generator=gen), dim=1)
    b = a.clone()
    b[9] = b[2]
    got = retrieval_metrics(a, b, ks=(1, 2), block_size=block_size)
    _assert_close(got, _reference(a, b, (1, 2)))
    assert got["retrieval/x2y_recall@1"] == pytest.approx(10 / 12)
    assert got["retrieval/x2y_recall@2"] == pytest.approx(11 / 12)
    assert got["retrieval/y2x_recall@1"] == pytest.approx(11 / 12)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_worker_threads_count_the_same(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    # Force the thread pool on a small input: its workers share out tiles (diagonal ones first)
    # and sum their own counts; the torch thread count is restored afterwards.
    import crl.eval.retrieval as retrieval

    monkeypatch.setattr(retrieval, "_MIN_SCORES_FOR_WORKERS", 0)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(7)
        a = torch.randint(-1, 2, (50, 3), generator=gen).float()
        b = torch.randint(-1, 2, (50, 3), generator=gen).float()
        got = retrieval_metrics(a, b, ks=(1, 3), block_size=6)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    _assert_close(got, _reference(a, b, (1, 3)))
