"""The batch order of an epoch, in one place: which training pairs step ``s`` sees.

Both samplers depend only on ``(seed, epoch)`` and the data, so the batches of an epoch can be
rebuilt at any position: a run resumed mid-epoch skips the consumed batches and continues bit for
bit. Every epoch has ``steps_per_epoch = n // batch_size`` full batches (docs/training.md).

- :class:`RandomBatches` (``train.sampler: random``, the default): a seeded permutation of the
  ``n`` pairs cut into consecutive batches; the last partial batch is dropped.
- :class:`NoDuplicateBatches` (``train.sampler: no_duplicates``): the same permutation, but a
  pair whose ``a`` or ``b`` view equals a view already in the batch waits for a later batch, so a
  duplicate text is never a negative of its twin (sentence-transformers' ``NoDuplicatesBatch
  Sampler`` does the same greedily).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching
from torch import Tensor

from crl.errors import CrlValueError


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> Tensor:
    """The data order of an epoch: a permutation of ``range(num_samples)`` that depends only on
    ``(seed, epoch)``.

    Example:
        >>> torch.equal(epoch_permutation(10, 0, 3), epoch_permutation(10, 0, 3))
        True
        >>> torch.equal(epoch_permutation(10, 0, 3), epoch_permutation(10, 0, 4))
        False
    """
    digest = hashlib.sha256(f"crl-data-order:{seed}:{epoch}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    return torch.randperm(num_samples, generator=generator)


class BatchSampler(Protocol):
    """What the trainer asks a sampler for."""

    steps_per_epoch: int

    def batches(self, epoch: int, start: int = 0) -> list[list[int]]:
        """The batches (lists of pair indices) of ``epoch`` from position ``start`` on."""
        ...


class RandomBatches:
    """A seeded permutation per epoch, cut into ``n // batch_size`` full batches.

    Example:
        >>> sampler = RandomBatches(10, 4, seed=0)
        >>> sampler.steps_per_epoch, [len(b) for b in sampler.batches(0)]
        (2, [4, 4])
        >>> sampler.batches(0, start=1) == sampler.batches(0)[1:]
        True
    """

    def __init__(self, num_samples: int, batch_size: int, *, seed: int) -> None:
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.steps_per_epoch = num_samples // batch_size

    def batches(self, epoch: int, start: int = 0) -> list[list[int]]:
        order = epoch_permutation(self.num_samples, self.seed, epoch)
        size = self.batch_size
        return [order[b * size:(b + 1) * size].tolist() for b in range(start, self.steps_per_epoch)]


def view_keys(views: Any) -> list[Hashable]:
    """One hashable key per item of a view: the text itself, or the bytes of a tensor row.

    Example:
        >>> view_keys(["x", "y"]), view_keys(torch.zeros(2, 1))[0] == view_keys(torch.zeros(1))[0]
        (['x', 'y'], True)
    """
    if isinstance(views, Tensor):
        rows = views.detach().cpu().contiguous().reshape(views.shape[0], -1)
        return [bytes(row.numpy().tobytes()) for row in rows]
    return [v if isinstance(v, str) else repr(v) for v in views]


class NoDuplicateBatches:
    """Batches in which no two pairs share an ``a`` view or a ``b`` view.

    The epoch's permutation (the one :class:`RandomBatches` uses) is read in order: a pair joins
    the batch being filled unless its ``a`` or ``b`` key is already there, in which case it waits
    in a queue that later batches read first. When the epoch's remaining pairs cannot complete a
    batch (a text repeated more often than batches remain), the batch is completed with pairs of
    this epoch's earlier batches that do not clash, in the epoch's order (and, should the pairs
    already in it leave no room, it becomes the first ``batch_size`` pairs of a maximum set of
    pairwise compatible pairs, found once). Deterministic in ``(seed, epoch)``, so resumable at
    any position.

    Args:
        keys_a, keys_b: One hashable key per training pair (:func:`view_keys`).
        batch_size: Pairs per batch.
        seed: The run's seed.

    Raises:
        CrlValueError: if no ``batch_size`` pairs have distinct ``a`` and distinct ``b`` views,
            so no batch can be filled.

    Example:
        >>> sampler = NoDuplicateBatches(["p", "p", "q", "r"], ["1", "2", "3", "4"], 2, seed=0)
        >>> all(0 not in b or 1 not in b for b in sampler.batches(0))
        True
    """

    def __init__(self, keys_a: Sequence[Hashable], keys_b: Sequence[Hashable], batch_size: int,
                 *, seed: int) -> None:
        if len(keys_a) != len(keys_b):
            raise CrlValueError(f"NoDuplicateBatches: `keys_a` and `keys_b` must have the same "
                                f"length; got {len(keys_a)} and {len(keys_b)}")
        ids: dict[Hashable, int] = {}
        # One integer per distinct view; a and b keys share the table only within their view.
        self._a = [ids.setdefault(("a", k), len(ids)) for k in keys_a]
        self._b = [ids.setdefault(("b", k), len(ids)) for k in keys_b]
        distinct = min(len(set(self._a)), len(set(self._b)))
        if distinct < batch_size:
            raise CrlValueError(
                f"train.sampler no_duplicates: the training split has only {distinct} distinct "
                f"texts in one view, fewer than train.batch_size = {batch_size}; lower the batch "
                "size or use train.sampler=random")
        self._fallback = self._compatible_pairs()
        if len(self._fallback) < batch_size:
            raise CrlValueError(
                f"train.sampler no_duplicates: at most {len(self._fallback)} training pairs have "
                f"distinct a and distinct b texts, fewer than train.batch_size = {batch_size}; "
                "lower the batch size or use train.sampler=random")
        self.num_samples, self.batch_size, self.seed = len(keys_a), batch_size, seed
        self.steps_per_epoch = self.num_samples // batch_size

    def _compatible_pairs(self) -> list[int]:
        """The most pairs that can share a batch (a maximum matching between the distinct
        ``a`` and ``b`` views, one pair per edge used): the batch of last resort."""
        first: dict[tuple[int, int], int] = {}  # one pair per (a view, b view) edge
        for item, edge in enumerate(zip(self._a, self._b, strict=True)):
            first.setdefault(edge, item)
        a = np.unique([e[0] for e in first], return_inverse=True)[1]
        b = np.unique([e[1] for e in first], return_inverse=True)[1]
        pairs = np.fromiter(first.values(), dtype=np.int64, count=len(first))
        graph = csr_matrix((pairs + 1, (a, b)))  # value: pair index + 1
        match = maximum_bipartite_matching(graph, perm_type="column")  # a view -> b view
        return sorted(int(graph[row, col]) - 1 for row, col in enumerate(match) if col >= 0)

    def batches(self, epoch: int, start: int = 0) -> list[list[int]]:
        order = epoch_permutation(self.num_samples, self.seed, epoch).tolist()
        rest = iter(order)
        waiting: deque[int] = deque()
        out: list[list[int]] = []
        for _ in range(self.steps_per_epoch):
            batch: list[int] = []
            taken: set[int] = set()
            passed: deque[int] = deque()  # clashed with this batch: first in line for the next
            while len(batch) < self.batch_size:
                item = waiting.popleft() if waiting else next(rest, None)
                if item is None:
                    break
                if self._a[item] in taken or self._b[item] in taken:
                    passed.append(item)
                    continue
                batch.append(item)
                taken.update((self._a[item], self._b[item]))
            waiting = passed + waiting
            if len(batch) < self.batch_size:  # the epoch ran dry: reuse earlier pairs
                batch = self._complete(batch, taken, order)
            out.append(batch)
        return out[start:]

    def _complete(self, batch: list[int], taken: set[int], order: list[int]) -> list[int]:
        members = set(batch)
        for item in order:
            if len(batch) == self.batch_size:
                return batch
            if item in members or self._a[item] in taken or self._b[item] in taken:
                continue
            batch.append(item)
            members.add(item)
            taken.update((self._a[item], self._b[item]))
        if len(batch) == self.batch_size:
            return batch
        # The pairs taken first leave no room (rare, with heavily repeated texts): the first
        # ``batch_size`` pairs of the matching, in the epoch's order, always fit together.
        rank = {item: position for position, item in enumerate(order)}
        return sorted(self._fallback, key=rank.__getitem__)[:self.batch_size]


def build_sampler(kind: str, dataset: Any, batch_size: int, *, seed: int) -> BatchSampler:
    """The sampler of ``train.sampler`` over a training split.

    Args:
        kind: ``random`` or ``no_duplicates``.
        dataset: The training split as loaded (before a model's ``prepare``, so text data still
            holds its texts): its length, and for ``no_duplicates`` its un-augmented views
            ``dataset.eval_views()``.
        batch_size: Pairs per batch (the global batch under torchrun).
        seed: ``train.seed``.
    """
    if kind == "no_duplicates":
        views_a, views_b = dataset.eval_views()
        return NoDuplicateBatches(view_keys(views_a), view_keys(views_b), batch_size, seed=seed)
    return RandomBatches(len(dataset), batch_size, seed=seed)


__all__ = [
    "BatchSampler",
    "NoDuplicateBatches",
    "RandomBatches",
    "build_sampler",
    "epoch_permutation",
    "view_keys",
]
