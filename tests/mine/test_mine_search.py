"""The search and selection under ``crl mine``: the blockwise running top-k and faiss equal a
full ``(Q, N)`` top-k; the relative margin's sign convention for negative positive scores;
bad options are one-line errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from crl.errors import CrlValueError
from crl.mine import MiningOptions, faiss_available, select_negatives, top_candidates


def test_blockwise_and_faiss_equal_the_full_top_k() -> None:
    g = torch.Generator().manual_seed(0)
    queries = F.normalize(torch.randn(50, 16, generator=g), dim=1)
    corpus = F.normalize(torch.randn(300, 16, generator=g), dim=1)
    full_s, full_i = torch.topk(queries @ corpus.T, 20, dim=1)
    backends = ["torch", "faiss"] if faiss_available() else ["torch"]
    for backend in backends:
        for block in (7, 64, 1000):
            out = top_candidates(queries, corpus, 20, backend=backend, block=block)  # type: ignore[arg-type]
            assert torch.equal(out.indices, full_i), (backend, block)
            torch.testing.assert_close(out.scores, full_s, rtol=0, atol=1e-6)


def test_a_corpus_smaller_than_k_is_padded() -> None:
    out = top_candidates(torch.eye(2), torch.eye(2), 4, backend="torch")
    assert out.indices.tolist() == [[0, 1, -1, -1], [1, 0, -1, -1]]
    assert math.isinf(float(out.scores[0, 3]))


def test_relative_margin_subtracts_a_fraction_of_the_magnitude() -> None:
    """For a negative positive score p the threshold is p - |p| r (below p), not p (1 - r)."""
    q = torch.tensor([[1.0, 0.0]])
    # the positive at 2.0 rad: p = cos 2 = -0.416; 2.03 rad scores -0.444, between p - |p| r =
    # -0.458 and p: dropped (p (1 - r) = -0.374, the sign-dependent form, would keep it)
    angles = torch.tensor([2.0, 2.03, 2.2, 2.5])
    corpus = torch.stack([angles.cos(), angles.sin()], dim=1)
    p = math.cos(2.0)
    idx, _, skipped = select_negatives(q, corpus, [[0]],
                                       MiningOptions(num_negatives=1, relative_margin=0.1))
    kept = [j for j in (1, 2, 3) if float(corpus[j, 0]) <= p - abs(p) * 0.1]
    assert kept[0] == 2 and idx.tolist() == [[2]] and skipped == {"relative_margin": 1}


@pytest.mark.parametrize(("options", "message"), [
    ({"num_negatives": 0}, "`num_negatives` must be >= 1; got 0"),
    ({"range_min": -1}, "`range_min` must be >= 0; got -1"),
    ({"margin": math.nan}, "`margin` must be a finite number or None"),
    ({"num_negatives": 2.5}, "`num_negatives` must be an integer"),
])
def test_bad_options_are_refused(options: dict, message: str) -> None:
    with pytest.raises(CrlValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MiningOptions(**options)


def test_a_window_too_small_for_the_negatives_is_refused() -> None:
    with pytest.raises(CrlValueError, match="cannot mine 5 negatives per anchor: only 3"):
        MiningOptions(num_negatives=5, range_min=2, range_max=5).window(1)
