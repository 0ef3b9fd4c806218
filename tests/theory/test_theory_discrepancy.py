"""Internal discrepancy, the mean-classifier loss and the collision probability
(docs/theory.md §6)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from scipy import stats

from crl.errors import CrlTypeError, CrlValueError
from crl.theory import collision_probability, internal_discrepancy


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """Small tensors: one thread avoids spin-waiting on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _jitter(x: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
    return x + 0.3 * torch.randn(x.shape, generator=g, dtype=x.dtype)


def test_against_loop_reference() -> None:
    g = torch.Generator().manual_seed(0)
    data = torch.randn(30, 4, generator=g, dtype=torch.float64)
    labels = torch.tensor([3, 7, 9] * 10)
    weight = torch.randn(4, 2, generator=g, dtype=torch.float64)

    def encoder(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ weight)

    rep = internal_discrepancy(encoder, data, _jitter, labels, num_augment=5,
                               generator=torch.Generator().manual_seed(1), batch_size=7)
    # Reference: the same augmentations, in the same order, then plain loops.
    g2 = torch.Generator().manual_seed(1)
    views = [encoder(_jitter(data, g2)) for _ in range(5)]
    feats = encoder(data)
    classes = [3, 7, 9]
    centres = {c: sum(feats[i] for i in range(30) if labels[i] == c) / 10 for c in classes}
    gaps, per_class, losses = [], {c: [] for c in classes}, []
    for i in range(30):
        c = int(labels[i])
        mu_pos = sum(v[i] for v in views) / 5
        gap = float(torch.linalg.norm(mu_pos - centres[c]))
        gaps.append(gap)
        per_class[c].append(gap)
        margins = [float(feats[i] @ (centres[c] - centres[o])) for o in classes if o != c]
        losses.append(math.log(1 + sum(math.exp(-v) for v in margins)))
    assert rep.overall == pytest.approx(float(np.mean(gaps)), abs=1e-12)
    assert rep.per_class.tolist() == pytest.approx([np.mean(per_class[c]) for c in classes])
    assert rep.supervised_loss == pytest.approx(float(np.mean(losses)), abs=1e-12)
    assert rep.classes.tolist() == classes
    assert rep.class_frequencies.tolist() == pytest.approx([1 / 3] * 3)
    for k, c in enumerate(classes):
        assert torch.allclose(rep.centres[k], centres[c])


def _class_data(n_per_class: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """x = (class, z1, z2), z ~ N(0, I_2): the first coordinate tells the class."""
    labels = torch.arange(3).repeat_interleave(n_per_class)
    z = torch.randn(labels.shape[0], 2, generator=g, dtype=torch.float64)
    return torch.cat([labels[:, None].double(), z], dim=1), labels


def test_zero_when_positives_come_from_the_whole_class() -> None:
    g = torch.Generator().manual_seed(2)
    data, labels = _class_data(2000, g)

    def whole_class(x: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        # A positive is a fresh draw from the anchor's class: it keeps nothing of z.
        fresh = torch.randn(x.shape[0], 2, generator=gen, dtype=x.dtype)
        return torch.cat([x[:, :1], fresh], dim=1)

    k = 400
    rep = internal_discrepancy(lambda x: x, data, whole_class, labels, num_augment=k,
                               generator=g)
    # Population ID is 0. On the sample, mu+(x) - mu_c = (mean of k fresh N(0, I_2)) - zbar_c,
    # whose norm is Rice-distributed with nu = |zbar_c| and sigma = 1/sqrt(k).
    sigma = 1 / math.sqrt(k)
    floor = [stats.rice(float(rep.centres[c, 1:].norm()) / sigma, scale=sigma).mean()
             for c in range(3)]
    assert rep.per_class.tolist() == pytest.approx(floor, rel=0.05)
    assert rep.overall < 0.1
    # Positives that stay near the anchor (jitter) keep ID near E||z|| = sqrt(pi / 2).
    near = internal_discrepancy(lambda x: x, data, _jitter, labels, num_augment=20, generator=g)
    assert near.overall == pytest.approx(math.sqrt(math.pi / 2), rel=0.05)
    assert near.per_class.min() > 10 * rep.per_class.max()


def test_collision_probability_against_enumeration() -> None:
    pi = [0.6, 0.3, 0.1]
    for k in range(0, 4):
        # P(some of k negatives drawn from pi shares the anchor's class), by enumeration.
        total = 0.0
        for c in range(3):
            for draw in itertools.product(range(3), repeat=k):
                if c in draw:
                    total += pi[c] * math.prod(pi[d] for d in draw)
        assert collision_probability(pi, k) == pytest.approx(total, abs=1e-12)
    # It grows with imbalance at fixed k.
    assert collision_probability([0.9, 0.05, 0.05], 4) > collision_probability([1 / 3] * 3, 4)


def test_bad_input() -> None:
    data = torch.zeros(4, 2)
    with pytest.raises(CrlValueError, match="labels"):
        internal_discrepancy(lambda x: x, data, _jitter, torch.zeros(3, dtype=torch.long))
    with pytest.raises(CrlValueError, match="labels"):
        internal_discrepancy(lambda x: x, data, _jitter, torch.zeros(4))
    with pytest.raises(CrlTypeError, match="callables"):
        internal_discrepancy("f", data, _jitter, torch.zeros(4, dtype=torch.long))
    with pytest.raises(CrlValueError, match=r"\(N, D\)"):
        internal_discrepancy(lambda x: x.sum(1), data, _jitter, torch.zeros(4, dtype=torch.long))
    with pytest.raises(CrlValueError, match="sum to 1"):
        collision_probability([0.5, 0.6], 2)
