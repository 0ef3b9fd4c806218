"""Sets that differ only in m share their ranks (crl.negatives.share_ranks): one SetFamily per
(n, regime, seed, labels) computes a block's ranks (or reads its level table) once for all its
sizes, and every set's mask stays what it is alone, bit for bit: against the lone sets asked
through the permutation every time and against a reference built on :func:`permute` itself, on
random blocks, for several m, both regimes, with and without labels, before and after the
table, in anchor slices or not."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

import crl.negatives.sets as sets_module
from crl.errors import CrlValueError
from crl.negatives import NegativeSets, SetFamily, permute, round_keys, share_ranks

REGIMES = ("shared", "independent")


@contextmanager
def _patched(name: str, value: int) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sets_module, name, value)
        yield


def _reference(n: int, m: int, regime: str, seed: int, labels: Tensor | None,
               anchors: Tensor, candidates: Tensor) -> Tensor:
    """``(B, K)`` membership from :func:`permute` (per-element keys, no tabulated rounds)."""
    not_self = anchors.unsqueeze(1) != candidates.unsqueeze(0)
    if m >= n:
        member = not_self
    elif regime == "shared":
        member = (permute(candidates, n, round_keys(seed)) < m).unsqueeze(0) & not_self
    else:
        shifted = candidates.unsqueeze(0) - (candidates.unsqueeze(0) > anchors.unsqueeze(1)).long()
        keys = round_keys(seed, anchors).unsqueeze(1)  # (B, 1, R)
        member = (permute(shifted.clamp(0, max(n - 2, 0)), max(n - 1, 1), keys) < m) & not_self
    if labels is not None:
        member = member & (labels[anchors].unsqueeze(1) != labels[candidates].unsqueeze(0))
    return member


def _blocks(n: int, count: int, seed: int) -> list[tuple[Tensor, Tensor]]:
    """Random (anchors, candidates) blocks: batches (the same index twice), rectangles with
    repeats, a block asked twice in a row, and the whole square."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for step in range(count):
        b = int(torch.randint(1, n + 1, (1,), generator=g))
        anchors = torch.randperm(n, generator=g)[:b]
        if step % 3 == 0:
            out.append((anchors, anchors))
        else:
            k = int(torch.randint(1, 2 * n + 1, (1,), generator=g))
            out.append((anchors, torch.randint(0, n, (k,), generator=g)))
        if step % 4 == 1:
            out.append(out[-1])
    out.append((torch.arange(n), torch.arange(n)))
    return out


def _sets(n: int, ms: list[int], regime: str, seed: int,
          labels: Tensor | None) -> list[NegativeSets]:
    return [NegativeSets(n, m, regime=regime, seed=seed, labels=labels)  # type: ignore[arg-type]
            for m in ms]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 90), regime=st.sampled_from(REGIMES), labelled=st.booleans(),
       seed=st.integers(0, 2**40), data=st.data())
def test_shared_ranks_give_every_set_its_own_masks(n: int, regime: str, labelled: bool,
                                                   seed: int, data: st.DataObject) -> None:
    ms = data.draw(st.lists(st.integers(1, n), min_size=2, max_size=6), label="ms")
    labels = torch.randint(0, 4, (n,), generator=torch.Generator().manual_seed(seed % 997)) \
        if labelled else None
    table = data.draw(st.booleans(), label="table")
    sliced = data.draw(st.booleans(), label="sliced")
    lone = _sets(n, ms, regime, seed, labels)
    shared = _sets(n, ms, regime, seed, labels)
    families = share_ranks(shared)
    ranked = sorted({m for m in ms if m < n})
    assert [f.sizes for f in families] == ([tuple(ranked)] if len(
        [m for m in ms if m < n]) >= 2 else [])
    if table:
        for family in families:
            family._permuted = n * n  # the next query builds the level table
    blocks = _blocks(n, 8, seed % 1000)
    with _patched("_SLICE", 3 if sliced else sets_module._SLICE):  # 3: in anchor slices
        got = [[one.mask(a, c) for one in shared] for a, c in blocks]
    with _patched("TABLE_MAX_ENTRIES", 0):  # the lone sets: the permutation every time
        want = [[one.mask(a, c) for one in lone] for a, c in blocks]
    for (a, c), row, lone_row in zip(blocks, got, want, strict=True):
        for m, mask, alone in zip(ms, row, lone_row, strict=True):
            assert torch.equal(mask, alone)
            assert torch.equal(mask, _reference(n, m, regime, seed, labels, a, c))
    if table:
        assert all(family._table is not None for family in families)


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("labelled", [False, True])
def test_the_level_table_holds_every_size(regime: str, labelled: bool) -> None:
    n, ms = 300, [1, 7, 7, 60, 299]
    labels = torch.arange(n) % 5 if labelled else None
    shared = _sets(n, ms, regime, 2, labels)
    (family,) = share_ranks(shared)
    family._permuted = n * n
    index = torch.arange(n)
    masks = [one.mask(index, index) for one in shared]
    assert family._table is not None and family._table.dtype == torch.uint8
    for one, mask in zip(shared, masks, strict=True):
        for i in (0, 1, 150, n - 1):  # the enumerated set, less the anchor (and its label)
            members = one.members(i if regime == "independent" else None)
            want = torch.zeros(n, dtype=torch.bool)
            want[members] = True
            want[i] = False
            if labels is not None:
                want &= labels != labels[i]
            assert torch.equal(mask[i], want)


def test_a_block_is_ranked_once_for_the_family(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = sets_module.permute_rows

    def counted(x: Tensor, *args: object, **kwargs: object) -> Tensor:
        calls.append(tuple(x.shape))
        return real(x, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sets_module, "permute_rows", counted)
    monkeypatch.setattr(sets_module, "TABLE_MAX_ENTRIES", 0)
    n, ms = 5000, [50, 500, 2500, 5000]
    shared = _sets(n, ms, "independent", 0, None)
    share_ranks(shared)
    g = torch.Generator().manual_seed(0)
    index = torch.randperm(n, generator=g)[:64]
    for one in shared:
        one.trusted().mask(index, index)
    assert calls == [(64, 64)]  # one permutation for the three sets with m < n
    index[:] = torch.randperm(n, generator=g)[:64]  # the same tensor, new values: ranked again
    masks = [one.mask(index, index) for one in shared]
    assert calls == [(64, 64), (64, 64)]
    lone = _sets(n, ms, "independent", 0, None)
    assert all(torch.equal(mask, one.mask(index, index))
               for mask, one in zip(masks, lone, strict=True))
    calls.clear()
    monkeypatch.setattr(sets_module, "MEMO_MAX_ENTRIES", 64 * 64 - 1)  # too big to keep
    other = torch.randperm(n, generator=g)[:64]
    for one in shared:
        one.mask(other, other)
    assert calls == [(64, 64)] * 3


def test_share_ranks_groups_by_n_regime_seed_and_labels() -> None:
    labels = torch.arange(40) % 3
    same = labels.clone()
    sets = [NegativeSets(40, 5, regime="independent", seed=1, labels=labels),
            NegativeSets(40, 9, regime="independent", seed=1, labels=same),  # equal labels
            NegativeSets(40, 9, regime="independent", seed=1),  # no labels
            NegativeSets(40, 3, regime="independent", seed=1),
            NegativeSets(40, 3, regime="independent", seed=2),  # another seed: alone
            NegativeSets(40, 4, regime="shared", seed=1),
            NegativeSets(40, 40, regime="shared", seed=1),  # m = n: no ranks
            NegativeSets(41, 6, regime="shared", seed=1)]  # another n: alone
    alone = [one._family for one in sets]
    families = share_ranks([*sets, sets[0]])  # one met twice counts once
    assert [(f.regime, f.sizes, f.labels is not None) for f in families] == [
        ("independent", (5, 9), True), ("independent", (3, 9), False)]
    assert sets[0]._family is sets[1]._family is families[0]
    assert sets[2]._family is sets[3]._family is families[1]
    assert [one._family is family for one, family in zip(sets, alone, strict=True)][4:] == [
        True, True, True, True]
    assert all(f.memo for f in families) and not any(f.memo for f in alone if f is not None)


def test_a_family_checks_its_sizes() -> None:
    with pytest.raises(CrlValueError, match="sizes"):
        SetFamily(10, "shared", 0, None, (3, 10))
    with pytest.raises(CrlValueError, match="sizes"):
        SetFamily(10, "shared", 0, None, ())
