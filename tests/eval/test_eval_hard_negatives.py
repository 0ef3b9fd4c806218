"""``retrieval_metrics(hard=...)``: each query's hard negatives are extra candidates of that
query only (x2y), checked against a loop written from the definition of the rank."""

from __future__ import annotations

import pytest
import torch

from crl.errors import CrlValueError
from crl.eval import retrieval_metrics


def _reference(a: torch.Tensor, b: torch.Tensor, hard: torch.Tensor) -> dict[str, float]:
    """Rank of b_i among all b_j and a_i's own hard negatives; ties count against it."""
    n, h = hard.shape[:2]
    ranks, aucs = [], []
    for i in range(n):
        positive = float(a[i] @ b[i])
        negatives = [float(a[i] @ b[j]) for j in range(n) if j != i]
        negatives += [float(a[i] @ hard[i, k]) for k in range(h)]
        ranks.append(1 + sum(s >= positive for s in negatives))
        aucs.append(sum(1.0 if s < positive else 0.5 if s == positive else 0.0
                        for s in negatives) / len(negatives))
    return {"recall@1": sum(r <= 1 for r in ranks) / n, "recall@3": sum(r <= 3 for r in ranks) / n,
            "auc": sum(aucs) / n, "mean_rank": sum(ranks) / n}


@pytest.mark.parametrize("seed", range(4))
def test_hard_negatives_match_the_reference_loop(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n, h, d = 13, 3, 4
    # Coarse values make exact ties between scores likely, as between duplicate texts.
    a = torch.randint(-2, 3, (n, d), generator=g).double()
    b = torch.randint(-2, 3, (n, d), generator=g).double()
    hard = torch.randint(-2, 3, (n, h, d), generator=g).double()
    hard[0, 1] = b[0]  # a hard negative identical to the positive ties with it
    got = retrieval_metrics(a, b, ks=(1, 3), block_size=5, hard=hard)
    ref = _reference(a, b, hard)
    for key, value in ref.items():
        assert got[f"retrieval/x2y_{key}"] == pytest.approx(value, abs=1e-12), key
    plain = retrieval_metrics(a, b, ks=(1, 3), block_size=5)
    for key in ("recall@1", "auc", "mean_rank"):  # the other direction is unchanged
        assert got[f"retrieval/y2x_{key}"] == plain[f"retrieval/y2x_{key}"]


def test_hard_shape_is_checked() -> None:
    a = torch.randn(4, 3)
    with pytest.raises(CrlValueError, match=r"`hard` must have shape \(4, H, 3\)"):
        retrieval_metrics(a, a, hard=torch.randn(3, 2, 3))
