"""Geometry and probes against references and on separable toy data."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from sklearn.metrics import balanced_accuracy_score

from crl.errors import CrlValueError
from crl.eval import accuracy_scores, alignment, knn_probe, linear_probe, uniformity, zero_shot


def test_alignment_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(9, 3, generator=gen).double(), torch.randn(9, 3, generator=gen).double()
    an, bn = a / a.norm(dim=1, keepdim=True), b / b.norm(dim=1, keepdim=True)
    want = sum(float((an[i] - bn[i]).norm()) ** 2 for i in range(9)) / 9
    assert alignment(a, b) == pytest.approx(want, rel=1e-10)
    assert alignment(a, a) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("block_size", [1, 4, 100])
def test_uniformity_reference(block_size: int) -> None:
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(11, 4, generator=gen).double()
    zn = z / z.norm(dim=1, keepdim=True)
    terms = [math.exp(-2.0 * float((zn[i] - zn[j]).norm()) ** 2)
             for i, j in itertools.permutations(range(11), 2)]
    want = math.log(sum(terms) / len(terms))
    assert uniformity(z, block_size=block_size) == pytest.approx(want, rel=1e-10)


def test_uniformity_prefers_spread_points() -> None:
    spread = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    bunched = torch.tensor([[1.0, 0.0], [1.0, 0.1], [1.0, -0.1], [1.0, 0.05]])
    assert uniformity(spread) < uniformity(bunched)


def test_accuracy_scores_matches_sklearn() -> None:
    gen = torch.Generator().manual_seed(2)
    y = torch.randint(0, 4, (50,), generator=gen)
    p = torch.randint(0, 4, (50,), generator=gen)
    got = accuracy_scores(p, y)
    assert got.accuracy == pytest.approx(float((p == y).double().mean()))
    assert got.balanced_accuracy == pytest.approx(balanced_accuracy_score(y.numpy(), p.numpy()))


def _blobs(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    centres = torch.tensor([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0]])
    return centres[labels] + 0.3 * torch.randn(n, 3, generator=gen), labels


def test_probes_on_separable_data() -> None:
    train_x, train_y = _blobs(0, 60)
    test_x, test_y = _blobs(1, 30)
    assert linear_probe(train_x, train_y, test_x, test_y).accuracy == 1.0
    assert knn_probe(train_x, train_y, test_x, test_y, k=5).balanced_accuracy == 1.0
    assert zero_shot(test_x, torch.eye(3), test_y).accuracy == 1.0


def test_probes_at_chance_on_shuffled_labels() -> None:
    train_x, train_y = _blobs(0, 300)
    test_x, test_y = _blobs(1, 300)
    shuffled = train_y[torch.randperm(300, generator=torch.Generator().manual_seed(0))]
    assert linear_probe(train_x, shuffled, test_x, test_y).accuracy < 0.6


def test_knn_weighted_vote_by_hand() -> None:
    # One close neighbour of class 1 outweighs two far neighbours of class 0 at a low temperature.
    train = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.05, 1.0]])
    labels = torch.tensor([1, 0, 0])
    query = torch.tensor([[1.0, 0.2]])
    assert knn_probe(train, labels, query, torch.tensor([1]), k=3, temperature=0.05).accuracy == 1
    assert knn_probe(train, labels, query, torch.tensor([0]), k=3, temperature=100.0).accuracy == 1


def test_probe_errors() -> None:
    x, y = _blobs(0, 10)
    with pytest.raises(CrlValueError, match="feature dimension"):
        linear_probe(x, y, x[:, :2], y)
    with pytest.raises(CrlValueError, match="train_y"):
        knn_probe(x, y[:5], x, y)
    with pytest.raises(CrlValueError, match="at least 2 classes"):
        linear_probe(x, torch.zeros(10, dtype=torch.long), x, y)
    with pytest.raises(CrlValueError, match="< 3"):
        zero_shot(x, torch.eye(3), y + 1)


@pytest.mark.parametrize("block_size", [1, 5, 64])
def test_heldout_risk_matches_contrastive_risk(block_size: int) -> None:
    from crl.eval import heldout_contrastive_risk
    from crl.losses import contrastive_risk

    gen = torch.Generator().manual_seed(4)
    a, b = torch.randn(13, 3, generator=gen).double(), torch.randn(13, 3, generator=gen).double()
    want = float(contrastive_risk(a, b, temperature=0.3))
    got = heldout_contrastive_risk(a, b, temperature=0.3, block_size=block_size)
    assert got == pytest.approx(want, rel=1e-10)
