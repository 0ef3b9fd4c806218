"""Negative sets of size m, decoupled from the batch (docs/theory.md §9).

Over a training set of ``n`` pairs, sample ``j`` is a negative of anchor ``i`` when ``j`` belongs
to the anchor's set: one set ``S`` of exactly ``m`` for every anchor (``"shared"``, SSCRL, the CLIP
setting) or one set ``S_i`` of exactly ``m`` per anchor (``"independent"``, SCRL). Membership is a
deterministic test on ``(seed, i, j)``: ``j in S`` iff ``rank(j) < m`` under a keyed pseudorandom
permutation of the candidates, so no ``n x m`` table is needed (a small one is kept once the
queries have paid for it; :class:`NegativeSets`).
"""

from __future__ import annotations

import math
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
    enumerated once (:meth:`members`, the inverse permutation) into a bool membership table of
    ``n`` (shared) or ``n x n`` (independent) entries, at most :data:`TABLE_MAX_ENTRIES`, and
    later queries read it. Both ways give the same sets (rank ``< m`` under the permutation is
    membership of the inverse image of ``range(m)``), so the table never costs more than twice
    the queries it replaces and changes no result.

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
        self._table: Tensor | None = None  # (n,) or (n, n) bool, built by _membership_table
        self._permuted = 0  # values the queries have permuted: what a table would have saved

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
        b, k = anchors.numel(), candidates.numel()
        if self.regime == "shared" or b * k <= 2 * _SLICE or b == 1:
            return self._mask(anchors, candidates)  # shared: one permutation of the candidates
        # Independent: slices of anchors of about _SLICE entries, so that the passes over an
        # (anchors, candidates) block around the permutation stay in cache.
        step = max(1, _SLICE // max(k, 1))
        return torch.cat([self._mask(anchors[i:i + step], candidates) for i in range(0, b, step)])

    def _mask(self, anchors: Tensor, candidates: Tensor) -> Tensor:
        """:meth:`mask` of checked int64 indices on one device."""
        not_self = anchors.unsqueeze(1) != candidates.unsqueeze(0)  # (B, K)
        b, k = anchors.numel(), candidates.numel()
        if self.m >= self.n or b == 0 or k == 0:
            member = not_self
        elif (table := self._table_after(k if self.regime == "shared" else b * k,
                                         anchors.device)) is not None:
            member = (table[candidates].unsqueeze(0) if self.regime == "shared"
                      else table[anchors.unsqueeze(1), candidates.unsqueeze(0)]) & not_self
        elif self.regime == "shared":
            rank = permute(candidates, self.n, self._shared_keys)  # (K,)
            member = (rank < self.m).unsqueeze(0) & not_self
        else:
            # Anchor i permutes the n - 1 others: j maps to j - [j > i] in range(n - 1).
            after = candidates.unsqueeze(0) > anchors.unsqueeze(1)  # (B, K)
            shifted = candidates.unsqueeze(0) - after.long()
            safe = shifted.clamp(min=0, max=self.n - 2)  # the j == i entries are dropped below
            rank = permute_rows(safe, self.n - 1, round_keys(self.seed, anchors))  # (B, K)
            member = (rank < self.m) & not_self
        if self.labels is not None:
            labels = self.labels.to(anchors.device)
            member = member & (labels[anchors].unsqueeze(1) != labels[candidates].unsqueeze(0))
        return member

    def _table_after(self, work: int, device: torch.device) -> Tensor | None:
        """The membership table on ``device`` once the queries, this one's ``work`` permuted
        values included, have cost as much as building it; None before, and always when it
        would exceed :data:`TABLE_MAX_ENTRIES`."""
        if self._table is None:
            rows = 1 if self.regime == "shared" else self.n
            if rows * self.n > TABLE_MAX_ENTRIES:
                return None
            self._permuted += work
            if self._permuted < rows * self.negatives_per_anchor:
                return None
            self._table = self._membership_table()
        if self._table.device != device:
            self._table = self._table.to(device)
        return self._table

    def _membership_table(self) -> Tensor:
        """``(n,)`` bool (shared: ``S``) or ``(n, n)`` (independent: row ``i`` is ``S_i``),
        from the enumerated sets (:meth:`members`, in anchor slices for the independent one)."""
        if self.regime == "shared":
            table = torch.zeros(self.n, dtype=torch.bool)
            table[self.members()] = True
            return table
        table = torch.zeros(self.n, self.n, dtype=torch.bool)
        size = self.negatives_per_anchor
        ranks = torch.arange(size)
        step = max(1, _SLICE // size)
        for start in range(0, self.n, step):
            anchors = torch.arange(start, min(start + step, self.n)).unsqueeze(1)  # (A, 1)
            others = permute_rows(ranks.expand(anchors.shape[0], size), self.n - 1,
                                  round_keys(self.seed, anchors), inverse=True)  # (A, size)
            table[anchors, others + (others >= anchors).long()] = True
        return table

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


__all__ = ["REGIMES", "NegativeSets", "Regime", "TrustedSets", "rows_with_negatives"]
