"""Tables that make the negative sets cheap change none of them: the tabulated round functions
of :func:`permute_rows` give :func:`permute`'s values, the membership table of
:class:`NegativeSets` (built once the queries have paid for it) the permutation's masks, and the
masks equal the ones recorded before either existed."""

from __future__ import annotations

import hashlib

import pytest
import torch

import crl.negatives.sets as sets_module
from crl.negatives import NegativeSets, permute, permute_rows, round_keys

REGIMES = ("shared", "independent")

#: sha256 (first 16 hex digits) and sum of 40 stacked (128, 128) batch masks, recorded with the
#: implementation before the table existed (commit c666d1a): the study's negatives.
RECORDED = [
    (500, 50, "independent", 0, "2c4bae6c3edeb624", 65246),
    (500, 200, "shared", 0, "0eab2cea44e6fe68", 261493),
    (2000, 20, "independent", 3, "f26c01a780e95013", 6609),
    (250, 5, "shared", 1, "bcda4f2faf232b4a", 12700),
    (65, 64, "independent", 7, "52c68089d82c5ba8", 166400),
]


def _batch_masks(sets: NegativeSets, steps: int = 40, batch: int = 128) -> torch.Tensor:
    g = torch.Generator().manual_seed(sets.n)
    masks = []
    for _ in range(steps):
        index = torch.randperm(sets.n, generator=g)[:batch]
        masks.append(sets.mask(index, index))
    return torch.stack(masks)  # (steps, B, B)


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 65, 256, 257, 499, 1000, 1999, 4097])
@pytest.mark.parametrize(("b", "k"), [(1, 1), (5, 7), (3, 64), (4, 300)])
def test_permute_rows_equals_permute(n: int, b: int, k: int, inverse: bool) -> None:
    # k >= 2**h: tabulated round functions; fewer: permute itself. Both: the same values.
    g = torch.Generator().manual_seed(n * 1000 + k)
    x = torch.randint(0, n, (b, k), generator=g)
    keys = round_keys(4, torch.randint(0, 10**6, (b,), generator=g))  # (B, R)
    got = permute_rows(x, n, keys, inverse=inverse)
    assert torch.equal(got, permute(x, n, keys.unsqueeze(1), inverse=inverse))
    assert torch.equal(permute_rows(got, n, keys, inverse=not inverse), x)


@pytest.mark.parametrize(("n", "m", "regime", "seed", "digest", "total"), RECORDED)
def test_masks_equal_the_recorded_ones(n: int, m: int, regime: str, seed: int, digest: str,
                                       total: int) -> None:
    sets = NegativeSets(n, m, regime=regime, seed=seed)  # type: ignore[arg-type]
    masks = _batch_masks(sets)
    assert sets._family is not None and sets._family._table is not None  # later steps read it
    assert hashlib.sha256(masks.numpy().tobytes()).hexdigest()[:16] == digest
    assert int(masks.sum()) == total


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize(("n", "m"), [(2, 1), (3, 1), (17, 4), (65, 30), (257, 256),
                                      (500, 5), (1025, 400)])
def test_the_table_equals_the_permutation(regime: str, n: int, m: int,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    labels = torch.arange(n) % 3
    table = NegativeSets(n, m, regime=regime, seed=9, labels=labels)  # type: ignore[arg-type]
    assert table._family is not None
    table._family._permuted = n * n  # the next query builds the table
    plain = NegativeSets(n, m, regime=regime, seed=9, labels=labels)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(n)
    queries = [(torch.randint(0, n, (37,), generator=g), torch.randint(0, n, (53,), generator=g)),
               (torch.arange(n), torch.arange(n))]
    got = [table.mask(a, c) for a, c in queries]
    assert table._family._table is not None
    with monkeypatch.context() as patch:
        patch.setattr(sets_module, "TABLE_MAX_ENTRIES", 0)  # the permutation every time
        want = [plain.mask(a, c) for a, c in queries]
    assert plain._family is not None and plain._family._table is None
    for g_mask, w_mask in zip(got, want, strict=True):
        assert torch.equal(g_mask, w_mask)

@pytest.mark.parametrize("regime", REGIMES)
def test_the_table_waits_until_the_queries_paid_for_it(regime: str) -> None:
    n, m = 400, 40
    sets = NegativeSets(n, m, regime=regime, seed=1)  # type: ignore[arg-type]
    cost = m if regime == "shared" else n * m  # permuted values to enumerate the sets
    per_query = 8 if regime == "shared" else 8 * 8
    index = torch.arange(8)
    queries = 0
    family = sets._family
    assert family is not None
    while family._table is None:
        sets.mask(index, index)
        queries += 1
    assert queries == -(-cost // per_query)  # the first query whose total reaches the cost
    shape = (n,) if regime == "shared" else (n * n,)  # flat: row i for anchor i
    assert tuple(family._table.shape) == shape
    assert family._table.dtype == torch.uint8  # one byte an entry, like a bool table


@pytest.mark.parametrize("regime", REGIMES)
def test_no_table_beyond_the_limit(regime: str, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 300
    monkeypatch.setattr(sets_module, "TABLE_MAX_ENTRIES", n - 1 if regime == "shared"
                        else n * n - 1)
    sets = NegativeSets(n, 3, regime=regime, seed=0)  # type: ignore[arg-type]
    for _ in range(3):
        sets.mask(torch.arange(n), torch.arange(n))
    assert sets._family is not None and sets._family._table is None
