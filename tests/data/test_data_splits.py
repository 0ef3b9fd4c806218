"""Splits: deterministic, disjoint, stratified, nested training subsets, long-tail counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from crl.data import DataConfig, class_counts, load_data
from crl.data.splits import long_tail_counts, long_tail_subset, split_indices, train_order
from crl.errors import CrlValueError


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), val=st.floats(0, 0.45), test=st.floats(0, 0.45),
       seed=st.integers(0, 2**31), classes=st.integers(0, 5))
def test_split_indices_partition_range(n: int, val: float, test: float, seed: int,
                                       classes: int) -> None:
    labels = None if classes == 0 else np.arange(n) % classes
    train, va, te = split_indices(n, val, test, seed, labels)
    joined = np.concatenate([train, va, te])
    assert sorted(joined.tolist()) == list(range(n))  # disjoint and covering
    again = split_indices(n, val, test, seed, labels)
    assert all((x == y).all() for x, y in zip((train, va, te), again, strict=True))


def test_stratified_split_counts_match_rounding_per_class() -> None:
    labels = np.repeat(np.arange(3), [50, 30, 21])
    train, val, test = split_indices(len(labels), 0.1, 0.2, seed=3, labels=labels)
    for c, n_c in enumerate([50, 30, 21]):
        assert (labels[test] == c).sum() == round(0.2 * n_c)
        assert (labels[val] == c).sum() == round(0.1 * n_c)
        assert (labels[train] == c).sum() == n_c - round(0.2 * n_c) - round(0.1 * n_c)


def test_split_depends_on_seed() -> None:
    a = split_indices(100, 0.1, 0.2, seed=0)[2]
    b = split_indices(100, 0.1, 0.2, seed=1)[2]
    assert not np.array_equal(a, b)


def test_train_order_nested_and_capped() -> None:
    idx = np.arange(10, 60)
    full = train_order(idx, seed=4, num_train=None)
    assert sorted(full.tolist()) == idx.tolist()
    for k in (1, 7, 50):
        assert np.array_equal(train_order(idx, 4, k), full[:k])
    with pytest.raises(CrlValueError, match="num_train"):
        train_order(idx, 4, 51)


def test_long_tail_counts_follow_the_exponential_profile() -> None:
    n_max, r, c = 120, 20.0, 10
    expected = [max(1, round(n_max * r ** (-k / (c - 1)))) for k in range(c)]
    assert long_tail_counts(n_max, c, r) == expected
    assert expected[0] == n_max and expected[-1] == 6
    assert long_tail_counts(7, 1, 5.0) == [7]


def test_long_tail_subset_keeps_the_counts() -> None:
    labels = np.repeat(np.arange(4), 40)
    kept = long_tail_subset(np.arange(160), labels, 8.0, seed=0)
    assert np.bincount(labels[kept]).tolist() == long_tail_counts(40, 4, 8.0)
    assert np.array_equal(kept, np.sort(kept))


@pytest.mark.parametrize("ratio", [10.0, 50.0])
def test_digits_long_tail_train_only(ratio: float) -> None:
    splits = load_data(DataConfig(name="digits", digits={"imbalance_ratio": ratio}))
    counts = class_counts(splits.train)
    assert counts.tolist() == long_tail_counts(int(counts[0]), 10, ratio)
    assert counts[-1] == round(counts[0] / ratio)
    assert all(counts[i] >= counts[i + 1] for i in range(9))
    balanced = load_data(DataConfig(name="digits"))
    for name in ("val", "test"):  # held-out splits do not depend on the ratio
        assert torch.equal(getattr(splits, name).labels, getattr(balanced, name).labels)
    test_counts = class_counts(splits.test)
    assert test_counts.max() - test_counts.min() <= 2


def _rows(t: torch.Tensor) -> set[tuple[float, ...]]:
    return {tuple(r) for r in t.tolist()}


def test_load_data_splits_disjoint_and_deterministic() -> None:
    cfg = DataConfig(name="synthetic", synthetic={"num_samples": 500})
    s1, s2 = load_data(cfg), load_data(cfg)
    for name in ("train", "val", "test"):
        assert torch.equal(getattr(s1, name).a, getattr(s2, name).a)
    train, val, test = (_rows(getattr(s1, n).a) for n in ("train", "val", "test"))
    assert not (train & val) and not (train & test) and not (val & test)
    assert len(train) + len(val) + len(test) == 500
    assert (len(s1.val), len(s1.test)) == (50, 100)


def test_seed_orders_training_split_but_keeps_test_set() -> None:
    base = DataConfig(name="synthetic", synthetic={"num_samples": 300})
    other = base.model_copy(update={"seed": 1})
    s0, s1 = load_data(base), load_data(other)
    assert torch.equal(s0.test.a, s1.test.a)
    assert not torch.equal(s0.train.a, s1.train.a)
    assert _rows(s0.train.a) == _rows(s1.train.a)
    small = load_data(base.model_copy(update={"num_train": 20}))
    assert torch.equal(small.train.a, s0.train.a[:20])  # nested subsets
    assert [small.train[i][2] for i in range(3)] == [0, 1, 2]  # index = position in the split
    with pytest.raises(CrlValueError, match="num_train"):
        load_data(base.model_copy(update={"num_train": 1000}))


def test_config_rejects_unknown_keys_and_bad_fractions() -> None:
    with pytest.raises(ValidationError, match="extra"):
        DataConfig(name="digits", bogus=1)
    with pytest.raises(ValidationError, match="val_fraction"):
        DataConfig(val_fraction=0.5, test_fraction=0.5)
    with pytest.raises(ValidationError, match="extra"):
        DataConfig(digits={"imbalance": 3})
