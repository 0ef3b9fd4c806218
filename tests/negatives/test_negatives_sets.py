"""Properties of the keyed permutation and of the shared / independent negative sets."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import crl.negatives.sets as sets_module
from crl.errors import CrlTypeError, CrlValueError
from crl.negatives import NegativeSets, permutation, permute, round_keys, rows_with_negatives

REGIMES = ("shared", "independent")


# --- the permutation --------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(n=st.one_of(st.sampled_from([1, 2, 3, 4, 5, 16, 17, 64, 65]),
                   st.integers(1, 3000)),
       seed=st.integers(0, 2**40))
def test_permutation_is_a_bijection_with_inverse(n: int, seed: int) -> None:
    keys = round_keys(seed)
    x = torch.arange(n)
    y = permute(x, n, keys)
    assert torch.equal(y.sort().values, x)  # onto range(n), so one-to-one
    assert torch.equal(permute(y, n, keys, inverse=True), x)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 500), seed=st.integers(0, 1000), anchors=st.lists(
    st.integers(0, 10**6), min_size=1, max_size=4))
def test_per_anchor_permutations_are_bijections(n: int, seed: int, anchors: list[int]) -> None:
    keys = round_keys(seed, torch.tensor(anchors))  # (A, R)
    x = torch.arange(n).unsqueeze(0).expand(len(anchors), n)  # (A, n)
    y = permute(x, n, keys.unsqueeze(1).expand(len(anchors), n, keys.shape[-1]))
    for row in y:
        assert torch.equal(row.sort().values, torch.arange(n))


def _ref_hash32(v: int) -> int:
    v &= 0xFFFFFFFF
    v = (((v >> 16) ^ v) * 0x45D9F3B) & 0xFFFFFFFF
    v = (((v >> 16) ^ v) * 0x45D9F3B) & 0xFFFFFFFF
    return (v >> 16) ^ v


def _ref_permute(v: int, n: int, keys: list[int], inverse: bool = False) -> int:
    """One value through the balanced Feistel network with cycle-walking, in plain Python."""
    h = 1
    while 4**h < n:
        h += 1
    mask = (1 << h) - 1
    while True:
        left, right = v >> h, v & mask
        for k in (reversed(keys) if inverse else keys):
            if inverse:
                left, right = right ^ (_ref_hash32(left ^ k) & mask), left
            else:
                left, right = right, left ^ (_ref_hash32(right ^ k) & mask)
        v = (left << h) | right
        if v < n:
            return v


@pytest.mark.parametrize("chunk", [5, 1 << 16])
@pytest.mark.parametrize("n", [7, 1000, 4097, 10**12])
def test_permutation_equals_the_plain_python_network(chunk: int, n: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Sliced (small chunk) or not, vectorised or not: the same sets for the same seed.
    monkeypatch.setattr(permutation, "CHUNK", chunk)
    g = torch.Generator().manual_seed(n % 1000)
    x = torch.randint(0, n, (6, 9), generator=g)
    shared = round_keys(3)
    per_anchor = round_keys(3, torch.arange(6) * 1000 + 7)  # (6, R)
    for inverse in (False, True):
        got = permute(x, n, shared, inverse=inverse)
        got_anchor = permute(x, n, per_anchor.unsqueeze(1), inverse=inverse)
        for i, j in itertools.product(range(6), range(9)):
            v = int(x[i, j])
            assert int(got[i, j]) == _ref_permute(v, n, shared.tolist(), inverse)
            assert int(got_anchor[i, j]) == _ref_permute(v, n, per_anchor[i].tolist(), inverse)


def test_permutation_mixes() -> None:
    # Not the identity, and different seeds give different permutations.
    n = 1000
    a = permute(torch.arange(n), n, round_keys(0))
    b = permute(torch.arange(n), n, round_keys(1))
    assert (a == torch.arange(n)).float().mean() < 0.05
    assert (a == b).float().mean() < 0.05


# --- the sets ---------------------------------------------------------------------------------


def brute_force_sets(sets: NegativeSets) -> list[set[int]]:
    """Each anchor's negatives, from the enumerated set (inverse permutation), by loops."""
    out = []
    for i in range(sets.n):
        members = sets.members(i if sets.regime == "independent" else None).tolist()
        out.append({j for j in members if j != i})
    return out


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize(("n", "m"), [(1, 1), (2, 1), (2, 2), (3, 2), (7, 3), (50, 1),
                                      (50, 17), (50, 49), (50, 50), (97, 40)])
def test_exactly_m_members(regime: str, n: int, m: int) -> None:
    sets = NegativeSets(n, m, regime=regime, seed=5)  # type: ignore[arg-type]
    full = sets.mask(torch.arange(n), torch.arange(n))  # (n, n)
    assert not full.diagonal().any()  # the own positive is never a negative
    counts = full.sum(dim=1)
    if regime == "independent":
        assert (counts == min(m, n - 1)).all()
    else:
        in_shared = torch.zeros(n, dtype=torch.bool)
        in_shared[sets.members()] = True
        assert int(in_shared.sum()) == m
        # every anchor sees the same S minus itself
        assert torch.equal(counts, torch.where(in_shared, m - 1, m))
        for i in range(n):
            assert torch.equal(full[i], in_shared & (torch.arange(n) != i))


@pytest.mark.parametrize("regime", REGIMES)
def test_m_equal_n_is_every_other_candidate(regime: str) -> None:
    n = 23
    full = NegativeSets(n, n, regime=regime, seed=3).mask(  # type: ignore[arg-type]
        torch.arange(n), torch.arange(n))
    assert torch.equal(full, ~torch.eye(n, dtype=torch.bool))


@pytest.mark.parametrize("chunk", [7, 1 << 16])  # 7: the mask is computed in anchor slices
@pytest.mark.parametrize("regime", REGIMES)
def test_batch_mask_equals_brute_force_membership(regime: str, chunk: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sets_module, "CHUNK", chunk)
    monkeypatch.setattr(sets_module, "_SLICE", 16 * chunk)  # fixed at import from CHUNK
    monkeypatch.setattr(permutation, "CHUNK", chunk)
    n, m = 60, 13
    sets = NegativeSets(n, m, regime=regime, seed=11)  # type: ignore[arg-type]
    truth = brute_force_sets(sets)
    index = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:20]
    mask = sets.batch_mask(index)
    for (r, i), (c, j) in itertools.product(enumerate(index.tolist()), repeat=2):
        assert bool(mask[r, c]) == (j in truth[i] and r != c)
    # a rectangular query agrees with the same sets
    cand = torch.arange(n)
    rect = sets.mask(index, cand)
    for r, i in enumerate(index.tolist()):
        assert set(rect[r].nonzero().squeeze(1).tolist()) == truth[i]
        assert set(sets.negatives_of(i).tolist()) == truth[i]


@pytest.mark.parametrize("regime", REGIMES)
def test_deterministic_and_seed_dependent(regime: str) -> None:
    n, m = 200, 40
    index = torch.arange(n)
    first = NegativeSets(n, m, regime=regime, seed=7).mask(index, index)  # type: ignore[arg-type]
    again = NegativeSets(n, m, regime=regime, seed=7).mask(index, index)  # type: ignore[arg-type]
    other = NegativeSets(n, m, regime=regime, seed=8).mask(index, index)  # type: ignore[arg-type]
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    # order of the query does not matter: membership is a function of (seed, i, j)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    shuffled = NegativeSets(n, m, regime=regime, seed=7).mask(  # type: ignore[arg-type]
        index[perm], index[perm])
    assert torch.equal(shuffled, first[perm][:, perm])


def test_independent_sets_differ_across_anchors_and_cover_uniformly() -> None:
    n, m = 200, 20
    full = NegativeSets(n, m, regime="independent", seed=2).mask(torch.arange(n), torch.arange(n))
    distinct = {tuple(row.nonzero().squeeze(1).tolist()) for row in full}
    assert len(distinct) == n
    # each candidate is chosen by about m / (n - 1) of the other anchors: mean m, sd about 4.2
    chosen = full.sum(dim=0).float()
    assert abs(float(chosen.mean()) - m) < 1e-9
    assert float(chosen.std()) < 8.0
    assert float(chosen.max()) < m + 25


@pytest.mark.parametrize("regime", REGIMES)
def test_huge_n_needs_no_table(regime: str) -> None:
    # n = 10**9 would need gigabytes for any n x m table; the query only touches the batch.
    n, m = 10**9, 10**7
    sets = NegativeSets(n, m, regime=regime, seed=0)  # type: ignore[arg-type]
    index = torch.randint(0, n, (128,), generator=torch.Generator().manual_seed(0))
    mask = sets.batch_mask(index)
    assert mask.shape == (128, 128)
    assert not mask.diagonal().any()
    # m / n = 1%: over 128 * 127 pairs about 163 are negatives; far from 0 and from all
    assert 40 < int(mask.sum()) < 600
    small = NegativeSets(n, 5000, regime=regime, seed=0)  # type: ignore[arg-type]
    members = small.members(3) if regime == "independent" else small.members()
    assert members.numel() == 5000
    assert len(set(members.tolist())) == 5000
    rect = small.mask(torch.tensor([3]), members[members != 3])
    assert bool(rect.all())  # enumerated members pass the forward membership test


def test_same_label_exclusion() -> None:
    n = 40
    labels = torch.arange(n) % 4
    plain = NegativeSets(n, 25, regime="independent", seed=1)
    labelled = NegativeSets(n, 25, regime="independent", seed=1, labels=labels)
    index = torch.arange(n)
    same = labels.unsqueeze(1) == labels.unsqueeze(0)
    assert torch.equal(labelled.mask(index, index), plain.mask(index, index) & ~same)
    batch = torch.tensor([0, 1, 4, 5, 9])
    by_batch_labels = plain.batch_mask(batch, labels=labels[batch])
    assert torch.equal(by_batch_labels, labelled.batch_mask(batch))


def test_rows_with_negatives_and_probability() -> None:
    n, m, b = 400, 4, 32
    sets = NegativeSets(n, m, regime="independent", seed=0)
    gen = torch.Generator().manual_seed(0)
    empty = []
    for _ in range(100):
        mask = sets.batch_mask(torch.randperm(n, generator=gen)[:b])
        rows = rows_with_negatives(mask)
        assert torch.equal(rows, mask.sum(dim=1) > 0)
        empty.append(float((~rows).float().mean()))
    p = sets.probability_no_negative(b)
    # hypergeometric: prod_{t < 31} (395 - t) / (399 - t), about 0.72
    ref = 1.0
    for t in range(b - 1):
        ref *= (n - 1 - m - t) / (n - 1 - t)
    assert abs(p - ref) < 1e-12
    assert abs(sum(empty) / len(empty) - p) < 0.04


def test_bad_input_is_rejected_with_names() -> None:
    with pytest.raises(CrlValueError, match="`m`"):
        NegativeSets(10, 11)
    with pytest.raises(CrlValueError, match="regime"):
        NegativeSets(10, 3, regime="both")  # type: ignore[arg-type]
    sets = NegativeSets(10, 3)
    with pytest.raises(CrlValueError, match="anchor_index"):
        sets.mask(torch.tensor([10]), torch.tensor([0]))
    with pytest.raises(CrlTypeError, match="candidate_index"):
        sets.mask(torch.tensor([1]), torch.tensor([0.0]))
    with pytest.raises(CrlValueError, match="labels"):
        NegativeSets(10, 3, labels=torch.zeros(9))
    with pytest.raises(CrlTypeError, match="mask"):
        rows_with_negatives(torch.zeros(3, 3))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), data=st.data(), seed=st.integers(0, 2**32),
       regime=st.sampled_from(REGIMES))
def test_set_sizes_hold_for_any_n_m_seed(n: int, data: st.DataObject, seed: int,
                                         regime: str) -> None:
    m = data.draw(st.integers(1, n))
    sets = NegativeSets(n, m, regime=regime, seed=seed)  # type: ignore[arg-type]
    full = sets.mask(torch.arange(n), torch.arange(n))
    assert not full.diagonal().any()
    if regime == "independent":
        assert (full.sum(dim=1) == min(m, n - 1)).all()
    else:
        in_shared = torch.zeros(n, dtype=torch.bool)
        in_shared[sets.members()] = True  # S enumerated through the inverse permutation
        assert int(in_shared.sum()) == m
        assert torch.equal(full.sum(dim=1), m - in_shared.long())


@pytest.mark.parametrize("regime", REGIMES)
def test_batch_mask_plugs_into_the_contrastive_losses(regime: str) -> None:
    from crl.losses import contrastive_risk, info_nce

    n, b = 300, 24
    gen = torch.Generator().manual_seed(0)
    index = torch.randperm(n, generator=gen)[:b]
    a = torch.nn.functional.normalize(torch.randn(b, 5, generator=gen, dtype=torch.float64), dim=1)
    p = torch.nn.functional.normalize(a + torch.randn(b, 5, generator=gen, dtype=torch.float64),
                                      dim=1)
    mask = NegativeSets(n, 150, regime=regime, seed=1).batch_mask(index)  # type: ignore[arg-type]
    assert rows_with_negatives(mask).all()
    s = (a @ p.T).tolist()
    want_nce, want_risk = 0.0, 0.0
    for i in range(b):
        negs = [j for j in range(b) if bool(mask[i, j])]
        den = math.exp(s[i][i] / 0.1) + sum(math.exp(s[i][j] / 0.1) for j in negs)
        want_nce += (math.log(den) - s[i][i] / 0.1) / b
        mean = sum(math.exp((s[i][j] - s[i][i]) / 0.1) for j in negs) / len(negs)
        want_risk += 0.1 * math.log(mean) / b
    assert float(info_nce(a, p, temperature=0.1, negatives_mask=mask)) == pytest.approx(want_nce)
    assert float(contrastive_risk(a, p, temperature=0.1, negatives_mask=mask)) == pytest.approx(
        want_risk)
