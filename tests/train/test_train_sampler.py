"""The epoch's batch order: the seeded random order, and no_duplicates (issue 14)."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crl.data.base import TensorPairDataset, TextPairDataset
from crl.errors import CrlValueError
from crl.train.sampler import (
    NoDuplicateBatches,
    RandomBatches,
    build_sampler,
    epoch_permutation,
    view_keys,
)


def test_random_batches_are_the_epoch_permutation_cut_in_batches() -> None:
    sampler = RandomBatches(50, 8, seed=3)
    order = epoch_permutation(50, 3, 2).tolist()
    assert sampler.steps_per_epoch == 6
    assert sampler.batches(2) == [order[i * 8:(i + 1) * 8] for i in range(6)]
    assert sampler.batches(2, start=4) == sampler.batches(2)[4:]
    assert sampler.batches(2) != sampler.batches(3)


def _clashes(batch: list[int], a: list[str], b: list[str]) -> bool:
    return len({a[i] for i in batch}) < len(batch) or len({b[i] for i in batch}) < len(batch)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 30)), min_size=4, max_size=60),
       st.integers(2, 6), st.integers(0, 3))
def test_no_duplicates_keeps_twins_apart(pairs: list[tuple[int, int]], batch_size: int,
                                         epoch: int) -> None:
    a, b = [f"a{x}" for x, _ in pairs], [f"b{y}" for _, y in pairs]
    try:
        sampler = NoDuplicateBatches(a, b, batch_size, seed=1)
    except CrlValueError as exc:  # no batch_size pairs fit together: checked by brute force
        assert "no_duplicates" in str(exc)
        if math.comb(len(pairs), batch_size) <= 20_000:
            assert not any(not _clashes(list(c), a, b)
                           for c in itertools.combinations(range(len(pairs)), batch_size))
        return
    batches = sampler.batches(epoch)
    assert len(batches) == len(pairs) // batch_size == sampler.steps_per_epoch
    for batch in batches:
        assert len(batch) == batch_size and len(set(batch)) == batch_size
        assert not _clashes(batch, a, b), batch
    # deterministic, and resumable at any position
    assert sampler.batches(epoch) == batches
    for start in range(len(batches) + 1):
        assert sampler.batches(epoch, start) == batches[start:]


@settings(max_examples=30, deadline=None)
@given(st.integers(4, 80), st.integers(2, 9), st.integers(0, 5))
def test_no_duplicates_without_duplicates_is_the_random_order(n: int, batch_size: int,
                                                              seed: int) -> None:
    if n < batch_size:
        return
    keys = [str(i) for i in range(n)]
    assert (NoDuplicateBatches(keys, keys, batch_size, seed=seed).batches(1)
            == RandomBatches(n, batch_size, seed=seed).batches(1))


def test_no_duplicates_with_many_twins_uses_each_pair_once_when_it_can() -> None:
    # 60 pairs, every `a` text twice (30 texts), batches of 6: a clash waits for a later batch.
    a = [f"q{i // 2}" for i in range(60)]
    b = [f"code{i}" for i in range(60)]
    batches = NoDuplicateBatches(a, b, 6, seed=0).batches(0)
    assert all(not _clashes(batch, a, b) for batch in batches)
    used = Counter(i for batch in batches for i in batch)
    assert len(used) >= 57 and max(used.values()) <= 2  # nearly a partition of the epoch
    random = RandomBatches(60, 6, seed=0).batches(0)
    assert any(_clashes(batch, a, b) for batch in random)  # what the sampler prevents


def test_build_sampler_reads_the_datasets_views() -> None:
    texts = TextPairDataset(["x", "x", "y", "z"], ["1", "2", "3", "4"])
    sampler = build_sampler("no_duplicates", texts, 2, seed=0)
    assert isinstance(sampler, NoDuplicateBatches)
    assert all(not (0 in batch and 1 in batch) for batch in sampler.batches(0))
    vectors = TensorPairDataset(torch.zeros(6, 2), torch.arange(12.0).reshape(6, 2))
    with pytest.raises(CrlValueError, match="only 1 distinct"):
        build_sampler("no_duplicates", vectors, 2, seed=0)  # six identical `a` vectors
    assert isinstance(build_sampler("random", vectors, 2, seed=0), RandomBatches)
    assert view_keys(torch.eye(2)) != view_keys(torch.eye(2).flip(0))
