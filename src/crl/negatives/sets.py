"""Negative sets of size m, decoupled from the batch (docs/theory.md §9).

Over a training set of ``n`` pairs, sample ``j`` is a negative of anchor ``i`` when ``j`` belongs
to the anchor's set: one set ``S`` of exactly ``m`` for every anchor (``"shared"``, SSCRL, the CLIP
setting) or one set ``S_i`` of exactly ``m`` per anchor (``"independent"``, SCRL). Membership is a
deterministic test on ``(seed, i, j)``: ``j in S`` iff ``rank(j) < m`` under a keyed pseudorandom
permutation of the candidates, so no ``n x m`` table is needed (a small one is kept once the
queries have paid for it; :class:`NegativeSets`). Sets that differ only in ``m`` (a group of runs,
:func:`share_ranks`) compute the ranks of a block once for all of them (:class:`SetFamily`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Literal

import torch
from torch import Tensor

from crl._validation import check_choice, check_index, check_int_range, describe
from crl.errors import CrlTypeError, CrlValueError
from crl.negatives.permutation import CHUNK, MAX_N, permute, permute_rows, round_keys

#: Entries per slice of an independent-regime mask (16 permutation chunks: few cycle-walking
#: rounds per slice, int64 temporaries of 8 MiB).
_SLICE = 16 * CHUNK
#: The largest membership table a :class:`NegativeSets` keeps (bools: 64 MiB): ``n`` entries
#: in the shared regime, ``n x n`` in the independent one (so up to ``n = 8192`` there).
TABLE_MAX_ENTRIES = 1 << 26
#: The largest block a shared :class:`SetFamily` keeps for its next set's query: a plain batch's
#: ``(B, B)`` mask (``B <= 2048``, :data:`crl.losses.tiled.PLAIN_MAX_BATCH`); keys of one byte
#: (levels, ranks below 256) to two (ranks below 32,768) or more.
MEMO_MAX_ENTRIES = 1 << 22

Regime = Literal["shared", "independent"]
REGIMES: tuple[str, ...] = ("shared", "independent")


def _check_labels(where: str, name: str, labels: object, length: int) -> Tensor:
    if not isinstance(labels, Tensor):
        raise CrlTypeError(f"{where}: `{name}` must be a torch.Tensor; got {describe(labels)}")
    if labels.dim() != 1 or labels.shape[0] != length:
        raise CrlValueError(
            f"{where}: `{name}` must have shape ({length},); got {tuple(labels.shape)}"
        )
    return labels


class NegativeSets:
    """Who is a negative of whom, for ``n`` training pairs and ``m`` negatives per anchor.

    ``"shared"``: one set ``S`` of exactly ``m`` of the ``n`` samples serves every anchor; anchor
    ``i``'s negatives are ``S \\ {i}`` (``m - 1`` of them when ``i in S``). ``"independent"``:
    anchor ``i`` draws its own set of exactly ``min(m, n - 1)`` from the other ``n - 1`` samples,
    with a permutation keyed by ``(seed, i)``. ``m = n`` means every other sample in both regimes.
    An anchor's own positive (sample ``i``) is never its negative. With ``labels``, samples that
    share the anchor's label are removed too (false negatives), so the sets then hold at most
    ``m``.

    A query costs O(B K) integer operations and memory is O(1) per anchor (the labels, if
    given, are the only O(n) object) until the queries have permuted as many values as
    enumerating every set would (``m`` shared, ``n m`` independent): the sets are then
    enumerated once (:meth:`members`, the inverse permutation) into a one-byte membership table
    of ``n`` (shared) or ``n x n`` (independent) entries, at most :data:`TABLE_MAX_ENTRIES`, and
    later queries read it. Both ways give the same sets (rank ``< m`` under the permutation is
    membership of the inverse image of ``range(m)``), so the table never costs more than twice
    the queries it replaces and changes no result. The ranks and the table belong to the sets'
    :class:`SetFamily`: their own, or one shared with the sets of other sizes ``m`` of the same
    ``(n, regime, seed, labels)`` (:func:`share_ranks`), which then computes each block once for
    all of them and keeps one table for all of them; the masks are the same.

    Args:
        n: Number of training pairs, ``1 <= n <= 2**62``.
        m: Negatives per anchor, ``1 <= m <= n``.
        regime: ``"shared"`` or ``"independent"``.
        seed: Non-negative integer: the sets are a deterministic function of ``(seed, i, j)``.
        labels: Optional ``(n,)`` integer labels of the samples; same-label candidates are
            then never negatives.

    Raises:
        CrlValueError / CrlTypeError: on out-of-range ``n``, ``m``, ``seed``, an unknown
            ``regime`` or labels of the wrong shape.

    Example:
        >>> sets = NegativeSets(10, 3, regime="independent", seed=0)
        >>> mask = sets.mask(torch.arange(10), torch.arange(10))  # (10, 10)
        >>> mask.sum(dim=1).tolist()
        [3, 3, 3, 3, 3, 3, 3, 3, 3, 3]
        >>> bool(mask.diagonal().any())
        False
    """

    def __init__(self, n: int, m: int, *, regime: Regime = "shared", seed: int = 0,
                 labels: Tensor | None = None) -> None:
        where = "NegativeSets"
        self.n = check_int_range(where, "n", n, 1, MAX_N)
        self.m = check_int_range(where, "m", m, 1, n)
        self.regime: Regime = "shared" if check_choice(where, "regime", regime,
                                                       REGIMES) == "shared" else "independent"
        self.seed = check_int_range(where, "seed", seed, 0, None)
        self.labels = None if labels is None else _check_labels(where, "labels", labels, n)
        self._shared_keys = round_keys(self.seed)
        # Whose ranks the queries threshold (None: m = n, every other candidate, no ranks) and
        # this set's position among the family's sizes.
        self._family: SetFamily | None = None
        self._slot = 0
        if self.m < self.n:
            self._join(SetFamily(self.n, self.regime, self.seed, self.labels, (self.m,)))

    def _join(self, family: SetFamily) -> None:
        """Threshold ``family``'s ranks from now on (one of the same ``n``, regime, seed and
        labels, whose sizes include ``m``)."""
        self._family, self._slot = family, family.sizes.index(self.m)

    @property
    def negatives_per_anchor(self) -> int:
        """The set size before removing the anchor itself or same-label samples."""
        return self.m if self.regime == "shared" else min(self.m, self.n - 1)

    def __repr__(self) -> str:
        return (f"NegativeSets(n={self.n}, m={self.m}, regime={self.regime!r}, seed={self.seed}"
                f"{', labels=...' if self.labels is not None else ''})")

    def mask(self, anchor_index: Tensor, candidate_index: Tensor) -> Tensor:
        """``(B, K)`` bool: True where sample ``candidate_index[k]`` is a negative of anchor
        ``anchor_index[b]``.

        Args:
            anchor_index: ``(B,)`` integer dataset indices of the anchors.
            candidate_index: ``(K,)`` integer dataset indices of the candidates.

        Returns:
            ``(B, K)`` bool tensor on ``anchor_index``'s device.

        Raises:
            CrlValueError / CrlTypeError: if an index is not a 1-D integer tensor in ``[0, n)``.
        """
        where = "NegativeSets.mask"
        anchors = check_index(where, "anchor_index", anchor_index, num_samples=self.n)
        candidates = check_index(where, "candidate_index", candidate_index, num_samples=self.n)
        return self._block(anchors, candidates.to(anchors.device))

    def trusted(self) -> TrustedSets:
        """These sets asked without index checks (no host synchronisation), for indices known
        to be valid: the trainer's batches."""
        return TrustedSets(self)

    def _block(self, anchors: Tensor, candidates: Tensor) -> Tensor:
        """:meth:`mask` of int64 indices in ``[0, n)`` on one device, without checks."""
        if self._family is None or anchors.numel() == 0 or candidates.numel() == 0:
            member = anchors.unsqueeze(1) != candidates.unsqueeze(0)  # (B, K): every other one
            if self.labels is not None:
                labels = self.labels.to(anchors.device)
                member &= labels[anchors].unsqueeze(1) != labels[candidates].unsqueeze(0)
            return member
        return self._family.member(anchors, candidates, self._slot)

    def batch_mask(self, index: Tensor, labels: Tensor | None = None) -> Tensor:
        """The ``(B, B)`` negatives mask of a batch: ``mask(index, index)``, diagonal False.

        Rows may be empty when ``m`` is small next to ``n`` and ``B`` (see
        :func:`rows_with_negatives`); :class:`~crl.losses.GlobalContrastiveLoss` skips such
        anchors, the other losses reject such masks.

        Args:
            index: ``(B,)`` dataset indices of the batch (distinct).
            labels: Optional ``(B,)`` labels of the batch: same-label pairs are removed as well.

        Returns:
            ``(B, B)`` bool, True where sample ``index[j]`` is a negative of anchor ``index[i]``.

        Example:
            >>> sets = NegativeSets(1000, 1000, regime="shared")  # m = n: every other sample
            >>> sets.batch_mask(torch.tensor([4, 8, 15])).long().tolist()
            [[0, 1, 1], [1, 0, 1], [1, 1, 0]]
        """
        mask = self.mask(index, index)
        if labels is not None:
            labels = _check_labels("NegativeSets.batch_mask", "labels", labels, index.numel())
            labels = labels.to(mask.device)
            mask = mask & (labels.unsqueeze(1) != labels.unsqueeze(0))
        eye = torch.eye(mask.shape[0], dtype=torch.bool, device=mask.device)
        return mask & ~eye

    def negatives_of(self, anchor: int) -> Tensor:
        """All negatives of one anchor, as sorted indices (O(n): for small ``n`` and tests)."""
        check_int_range("NegativeSets.negatives_of", "anchor", anchor, 0, self.n - 1)
        row = self.mask(torch.tensor([anchor]), torch.arange(self.n))[0]
        return row.nonzero().squeeze(1)

    def members(self, anchor: int | None = None) -> Tensor:
        """The set itself, enumerated through the inverse permutation (O(m) work).

        Args:
            anchor: For ``"independent"``, the anchor whose set is wanted (required); ignored
                for ``"shared"``.

        Returns:
            Sorted int64 ``(m,)`` indices (``(min(m, n - 1),)`` for ``"independent"``), before
            the same-label filter. For ``"shared"`` the anchor's own index may be included.
        """
        where = "NegativeSets.members"
        ranks = torch.arange(self.negatives_per_anchor)
        if self.regime == "shared":
            return permute(ranks, self.n, self._shared_keys, inverse=True).sort().values
        if anchor is None:
            raise CrlValueError(
                f"{where}: `anchor` is required for the independent regime; got None"
            )
        check_int_range(where, "anchor", anchor, 0, self.n - 1)
        if self.n == 1:
            return torch.zeros(0, dtype=torch.int64)
        keys = round_keys(self.seed, torch.tensor([anchor])).expand(ranks.numel(), -1)
        others = permute(ranks, self.n - 1, keys, inverse=True)
        return (others + (others >= anchor).long()).sort().values

    def probability_no_negative(self, batch_size: int) -> float:
        """P(an anchor has no negative among the other ``B - 1`` members of a uniform batch).

        Hypergeometric: ``prod_{t < B-1} (n - 1 - m_i - t) / (n - 1 - t)`` with ``m_i`` the
        anchor's set size (``m`` for anchors outside a shared ``S``; labels ignored).

        Example:
            >>> sets = NegativeSets(10_000, 100, regime="independent")
            >>> round(sets.probability_no_negative(batch_size=256), 3)
            0.075
        """
        check_int_range("NegativeSets.probability_no_negative", "batch_size", batch_size, 1,
                        self.n)
        others = self.n - 1
        size = min(self.negatives_per_anchor, others)
        if others - size < batch_size - 1:
            return 0.0
        log_p = (math.lgamma(others - size + 1) - math.lgamma(others - size - batch_size + 2)
                 - math.lgamma(others + 1) + math.lgamma(others - batch_size + 2))
        return math.exp(log_p)


class TrustedSets:
    """:class:`NegativeSets` asked without checks (:meth:`NegativeSets.trusted`): a
    :class:`~crl.losses.TileMask` for indices known to be valid."""

    def __init__(self, sets: NegativeSets) -> None:
        self.sets = sets

    def mask(self, anchor_index: Tensor, candidate_index: Tensor, /) -> Tensor:
        """``(B, K)`` bool, as :meth:`NegativeSets.mask` (indices not checked)."""
        return self.sets._block(anchor_index.to(torch.int64),
                                candidate_index.to(device=anchor_index.device,
                                                   dtype=torch.int64))


def _narrowest(top: int) -> torch.dtype:
    """The narrowest integer dtype that holds ``range(top + 1)``."""
    for dtype in (torch.uint8, torch.int16, torch.int32):
        if top <= torch.iinfo(dtype).max:
            return dtype
    return torch.int64


class SetFamily:
    """The negative sets of one ``(n, regime, seed, labels)`` at the sizes ``sizes``: the keys of
    a block computed once for all of them.

    A set of size ``m`` holds ``j`` for anchor ``i`` iff ``rank(j) < m`` under a permutation
    keyed by ``(seed, regime, i)``, not by ``m``: sets of one family differ only in the
    threshold. The family gives each ``(anchor, candidate)`` pair one integer *key* and each
    size a *cut*, the set of ``sizes[k]`` being ``key < cuts[k]``:

    - before a table, the key is the rank itself (cuts: the sizes);
    - once the family's queries have permuted as many values as enumerating its largest set
      for every anchor would (``n max(sizes)`` independent, ``max(sizes)`` shared), and the
      table has at most :data:`TABLE_MAX_ENTRIES` entries, the key is read from a table of
      *levels*: the number of sizes at most the rank (cuts ``1 .. L`` for ``L`` sizes: ``level
      <= k`` iff ``rank < sizes[k]``), ``n`` entries shared or ``n x n`` independent (flat,
      row ``i`` for anchor ``i``): one byte each for up to 255 sizes, as many bytes as one
      set's bool membership table;
    - a pair that is no candidate (the anchor itself, a same-label sample) gets the largest
      cut, which no cut exceeds.

    A family of one size is what a :class:`NegativeSets` computes alone, with the same table
    rule. A shared family (:func:`share_ranks`) also keeps the keys of its last block of at most
    :data:`MEMO_MAX_ENTRIES` entries, with copies of its indices, so that the next set asking
    for the same indices (``torch.equal``) only compares them with its cut.

    Args:
        n: Number of training pairs.
        regime: ``"shared"`` or ``"independent"``.
        seed: The sets' seed.
        labels: ``(n,)`` labels whose equal pairs are no negatives, or None.
        sizes: The sizes ``m`` of its sets, each in ``[1, n)`` (``m = n`` needs no ranks).
        memo: Keep the last block's keys for the next query.

    Example:
        >>> family = SetFamily(10, "independent", 0, None, (3, 6), memo=True)
        >>> index = torch.arange(10)
        >>> [int(family.member(index, index, k).sum()) for k in range(2)]
        [30, 60]
    """

    def __init__(self, n: int, regime: Regime, seed: int, labels: Tensor | None,
                 sizes: Sequence[int], *, memo: bool = False) -> None:
        self.n, self.regime, self.seed, self.labels = n, regime, seed, labels
        self.sizes: tuple[int, ...] = tuple(sorted(set(sizes)))
        if not self.sizes or self.sizes[0] < 1 or self.sizes[-1] >= n:
            raise CrlValueError(f"SetFamily: `sizes` must be in [1, {n - 1}]; got {list(sizes)}")
        self.memo = bool(memo)
        shared = regime == "shared"
        # The regime's ways, chosen once: one permutation of the candidates (shared) or one per
        # anchor, and tables of n or n x n entries.
        self._per_anchor = not shared
        self._rows = 1 if shared else n
        self._ranks = self._shared_ranks if shared else self._independent_ranks
        self._read = self._read_shared if shared else self._read_independent
        self._enumerate = self._enumerate_shared if shared else self._enumerate_independent
        self._shared_keys = round_keys(seed)
        self._rank_dtype = _narrowest(n - 1)  # ranks and their largest cut, below n
        self._level_dtype = _narrowest(len(self.sizes))
        self._level_cuts = tuple(range(1, len(self.sizes) + 1))
        self._table: Tensor | None = None  # (rows * n,) levels, built by _level_table
        self._permuted = 0  # values the queries have permuted: what a table would have saved
        self._last: tuple[Tensor, Tensor, Tensor, tuple[int, ...]] | None = None

    def __repr__(self) -> str:
        return (f"SetFamily(n={self.n}, regime={self.regime!r}, seed={self.seed}, "
                f"sizes={list(self.sizes)}{', labels=...' if self.labels is not None else ''})")

    def member(self, anchors: Tensor, candidates: Tensor, slot: int) -> Tensor:
        """``(B, K)`` bool: the set of size ``sizes[slot]``'s mask of the block.

        Args:
            anchors: ``(B,)`` int64 indices in ``[0, n)``, ``B >= 1``.
            candidates: ``(K,)`` int64 indices in ``[0, n)`` on the same device, ``K >= 1``.
            slot: The set's position in :attr:`sizes`.
        """
        keys, cuts = self._keys(anchors, candidates)
        return keys < cuts[slot]

    def _keys(self, anchors: Tensor, candidates: Tensor) -> tuple[Tensor, tuple[int, ...]]:
        """The block's ``(B, K)`` keys and the cuts of the sizes: the last block's if these are
        its indices, else computed (from the table once it has paid for itself)."""
        last = self._last
        if last is not None and last[0].device == anchors.device \
                and torch.equal(last[0], anchors) and torch.equal(last[1], candidates):
            return last[2], last[3]  # (torch.equal: False for another shape)
        b, k = anchors.numel(), candidates.numel()
        table = self._table_after(b * k if self._per_anchor else k, anchors.device)
        if table is None:
            keys, cuts = self._ranks(anchors, candidates), self.sizes
        else:
            keys, cuts = self._read(table, anchors, candidates), self._level_cuts
        if self.labels is not None:
            labels = self.labels.to(anchors.device)
            keys.masked_fill_(labels[anchors].unsqueeze(1) == labels[candidates].unsqueeze(0),
                              cuts[-1])
        if self.memo and b * k <= MEMO_MAX_ENTRIES:
            self._last = (anchors.clone(), candidates.clone(), keys, cuts)
        return keys, cuts

    def _shared_ranks(self, anchors: Tensor, candidates: Tensor) -> Tensor:
        """``(B, K)`` ranks of the candidates under the one permutation (the largest size
        where the candidate is the anchor), in :attr:`_rank_dtype`."""
        rank = permute(candidates, self.n, self._shared_keys).to(self._rank_dtype)  # (K,)
        not_self = anchors.unsqueeze(1) != candidates.unsqueeze(0)  # (B, K)
        return torch.where(not_self, rank.unsqueeze(0), self.sizes[-1])

    def _independent_ranks(self, anchors: Tensor, candidates: Tensor) -> Tensor:
        """:meth:`_shared_ranks` under each anchor's permutation, in slices of anchors of about
        ``_SLICE`` entries (the passes over a block around the permutation stay in cache)."""
        b, k = anchors.numel(), candidates.numel()
        if b * k <= 2 * _SLICE or b == 1:
            return self._anchor_ranks(anchors, candidates)
        step = max(1, _SLICE // k)
        return torch.cat([self._anchor_ranks(anchors[i:i + step], candidates)
                          for i in range(0, b, step)])

    def _anchor_ranks(self, anchors: Tensor, candidates: Tensor) -> Tensor:
        """One slice of :meth:`_independent_ranks`: anchor ``i`` permutes the ``n - 1`` others,
        ``j`` mapped to ``j - [j > i]`` in ``range(n - 1)``."""
        after = candidates.unsqueeze(0) > anchors.unsqueeze(1)  # (B, K)
        shifted = candidates.unsqueeze(0) - after.long()
        safe = shifted.clamp(min=0, max=self.n - 2)  # the j == i entries are replaced below
        rank = permute_rows(safe, self.n - 1, round_keys(self.seed, anchors))  # (B, K)
        not_self = anchors.unsqueeze(1) != candidates.unsqueeze(0)
        return torch.where(not_self, rank, self.sizes[-1]).to(self._rank_dtype)

    def _read_shared(self, table: Tensor, anchors: Tensor, candidates: Tensor) -> Tensor:
        """``(B, K)`` levels of the candidates from the ``(n,)`` table (the largest cut where
        the candidate is the anchor)."""
        not_self = anchors.unsqueeze(1) != candidates.unsqueeze(0)  # (B, K)
        return torch.where(not_self, table[candidates].unsqueeze(0), self._level_cuts[-1])

    def _read_independent(self, table: Tensor, anchors: Tensor, candidates: Tensor) -> Tensor:
        """``(B, K)`` levels from the flat ``(n * n,)`` table (its diagonal holds the largest
        cut); one flat ``index_select`` is faster than indexing rows and columns."""
        flat = (anchors.unsqueeze(1) * self.n + candidates.unsqueeze(0)).view(-1)  # (B K,)
        return table.index_select(0, flat).view(anchors.numel(), candidates.numel())

    def _table_after(self, work: int, device: torch.device) -> Tensor | None:
        """The level table on ``device`` once the queries, this one's ``work`` permuted values
        included, have cost as much as building it; None before, and always when it would
        exceed :data:`TABLE_MAX_ENTRIES`."""
        if self._table is None:
            if self._rows * self.n > TABLE_MAX_ENTRIES:
                return None
            self._permuted += work
            if self._permuted < self._rows * self.sizes[-1]:
                return None
            self._table = self._level_table()
        if self._table.device != device:
            self._table = self._table.to(device)
        return self._table

    def _level_table(self) -> Tensor:
        """The flat ``(n,)`` (shared) or ``(n * n,)`` (independent: row ``i`` for anchor
        ``i``) levels: the number of sizes at most the candidate's rank, ``L`` outside the
        largest set (and on the diagonal), from the largest set enumerated through the inverse
        permutation."""
        top = self.sizes[-1]
        level = torch.bucketize(torch.arange(top), torch.tensor(self.sizes), right=True).to(
            self._level_dtype)  # (top,): how many sizes are at most the rank
        table = torch.full((self._rows * self.n,), len(self.sizes), dtype=self._level_dtype)
        self._enumerate(table, level)
        return table

    def _enumerate_shared(self, table: Tensor, level: Tensor) -> None:
        """Write the levels of the set's ``top`` members into the ``(n,)`` table."""
        ranks = torch.arange(level.numel())
        table[permute(ranks, self.n, self._shared_keys, inverse=True)] = level

    def _enumerate_independent(self, table: Tensor, level: Tensor) -> None:
        """Write each anchor's ``top`` members' levels into its row of the flat table, in
        slices of anchors."""
        top = level.numel()
        ranks = torch.arange(top)
        step = max(1, _SLICE // top)
        for start in range(0, self.n, step):
            anchors = torch.arange(start, min(start + step, self.n)).unsqueeze(1)  # (A, 1)
            others = permute_rows(ranks.expand(anchors.shape[0], top), self.n - 1,
                                  round_keys(self.seed, anchors), inverse=True)  # (A, top)
            table[anchors * self.n + others + (others >= anchors).long()] = level


def _same_labels(left: Tensor | None, right: Tensor | None) -> bool:
    """Both None, or the same labels (one tensor, or equal ones of one dtype and device)."""
    if left is None or right is None:
        return left is right
    return left is right or (left.dtype == right.dtype and left.device == right.device
                             and torch.equal(left, right))


def share_ranks(sets: Iterable[NegativeSets]) -> list[SetFamily]:
    """Let the sets that differ only in ``m`` compute their ranks once for all of them: one
    :class:`SetFamily` (with a memo of the last block) for each ``(n, regime, seed, labels)``
    of at least two sets with ``m < n``. Their masks do not change; their tables and
    accounting start again. Meant for a group of runs, once when it is built
    (:func:`crl.train.fit_group`), where every set is asked the same blocks in turn.

    Args:
        sets: Negative sets (one met twice counts once).

    Returns:
        The shared families made.

    Example:
        >>> group = [NegativeSets(100, m, regime="independent", seed=3) for m in (5, 50, 100)]
        >>> share_ranks(group)
        [SetFamily(n=100, regime='independent', seed=3, sizes=[5, 50])]
        >>> index = torch.arange(100)
        >>> torch.equal(group[0].mask(index, index),
        ...             NegativeSets(100, 5, regime="independent", seed=3).mask(index, index))
        True
    """
    families: list[list[NegativeSets]] = []
    seen: set[int] = set()
    for one in sets:
        if one.m >= one.n or id(one) in seen:
            continue  # every other candidate: no ranks; or met already
        seen.add(id(one))
        for family in families:
            first = family[0]
            if (first.n, first.regime, first.seed) == (one.n, one.regime, one.seed) \
                    and _same_labels(first.labels, one.labels):
                family.append(one)
                break
        else:
            families.append([one])
    made = []
    for family in families:
        if len(family) < 2:
            continue
        first = family[0]
        shared = SetFamily(first.n, first.regime, first.seed, first.labels,
                           [one.m for one in family], memo=True)
        for one in family:
            one._join(shared)
        made.append(shared)
    return made


def rows_with_negatives(mask: Tensor) -> Tensor:
    """``(B,)`` bool: which rows of a ``(B, K)`` negatives mask have at least one True entry.

    Example:
        >>> rows_with_negatives(torch.tensor([[False, True], [False, False]])).tolist()
        [True, False]
    """
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
        raise CrlTypeError(
            f"rows_with_negatives: `mask` must be a 2-D bool tensor; got {describe(mask)}"
        )
    return mask.any(dim=1)


__all__ = ["MEMO_MAX_ENTRIES", "REGIMES", "TABLE_MAX_ENTRIES", "NegativeSets", "Regime",
           "SetFamily", "TrustedSets", "rows_with_negatives", "share_ranks"]
