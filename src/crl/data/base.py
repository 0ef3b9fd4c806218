"""Pair data sets: what every data set yields, and the splits :func:`crl.data.load_data` returns.

A :class:`PairDataset` item is ``(view_a, view_b, index, label)``: ``index`` is the item's position
in its split (``0 .. len - 1``, the key of per-sample state such as GCL's ``u``) and ``label`` an
int, ``-1`` when the data has no labels. Data with hard negatives yields a fifth element: the
item's ``H`` hard negatives in view-b form (``H`` texts, or a tensor ``(H, ...)``), so a batch
is ``(xa, xb, index, labels, xh)`` with ``xh`` of shape ``(B, H, ...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from crl.errors import CrlValueError

Item = tuple[Any, ...]


@dataclass(frozen=True)
class DataInfo:
    """What a model needs to know about the data.

    Attributes:
        kind: ``vector`` (tensors ``(D,)``), ``image`` (tensors ``image_shape``) or ``text`` (str).
        dim_a, dim_b: Feature dimensions of the two views (vector data), else None.
        image_shape: ``(C, H, W)`` of image data, else None.
        num_classes: Number of classes when there are labels, else None.
        name: The data set's name.
        provenance: Where the data came from (roots and package versions, file path and hash...).
    """

    kind: Literal["vector", "image", "text"]
    dim_a: int | None
    dim_b: int | None
    image_shape: tuple[int, ...] | None
    num_classes: int | None
    name: str
    provenance: dict[str, Any] = field(default_factory=dict)


class PairDataset(Dataset[Item]):
    """Base class of the pair data sets (a ``torch.utils.data.Dataset``).

    Subclasses implement ``__len__``, ``_views(i)``, ``eval_views()`` and ``subset(indices)``.
    """

    labels: Tensor | None

    def __init__(self, labels: Tensor | None) -> None:
        self.labels = labels
        self.epoch = 0

    def __len__(self) -> int:
        raise NotImplementedError

    def _views(self, i: int) -> tuple[Any, Any]:
        raise NotImplementedError

    def eval_views(self) -> tuple[Any, Any]:
        """The deterministic un-augmented views of all items: tensors ``(N, ...)`` or str lists."""
        raise NotImplementedError

    def subset(self, indices: Sequence[int] | np.ndarray) -> PairDataset:
        """A new data set of the items at ``indices`` (in that order), re-indexed from 0."""
        raise NotImplementedError

    @property
    def is_text(self) -> bool:
        """True when the views are strings (models turn them into tensors with ``prepare``)."""
        return False

    @property
    def num_hard_negatives(self) -> int:
        """``H``, the hard negatives each item carries (0: none)."""
        return 0

    def _hard(self, i: int) -> Any:
        raise NotImplementedError

    def hard_negative_views(self) -> Any:
        """The hard negatives of all items in view-b form: ``(N, H, ...)`` tensor or N lists of
        ``H`` texts; None when the data has none."""
        return None

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch that seeds the augmentations (with the seed and the item's index)."""
        self.epoch = int(epoch)

    def __getitem__(self, i: int) -> Item:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for a data set of {n} pairs")
        i = i % n
        a, b = self._views(i)
        label = -1 if self.labels is None else int(self.labels[i])
        if self.num_hard_negatives:
            return a, b, i, label, self._hard(i)
        return a, b, i, label

    def __getitems__(self, indices: Sequence[int]) -> list[Item]:
        """Several items at once (torch's DataLoader fetches a batch this way); data sets that
        can build a batch faster than item by item override it."""
        return [self[int(i)] for i in indices]

    def _subset_labels(self, idx: np.ndarray) -> Tensor | None:
        return None if self.labels is None else self.labels[torch.as_tensor(idx, dtype=torch.long)]


class TensorPairDataset(PairDataset):
    """Paired tensors ``a (N, ...)`` and ``b (N, ...)`` (vectors, or features after ``prepare``).

    Example:
        >>> ds = TensorPairDataset(torch.zeros(3, 2), torch.ones(3, 2))
        >>> a, b, index, label = ds[1]
        >>> a.shape, b.tolist(), index, label
        (torch.Size([2]), [1.0, 1.0], 1, -1)
    """

    def __init__(self, a: Tensor, b: Tensor, labels: Tensor | None = None,
                 hard: Tensor | None = None) -> None:
        if a.shape[0] != b.shape[0]:
            raise CrlValueError(
                f"TensorPairDataset: `a` and `b` must have the same number of rows; "
                f"got {a.shape[0]} and {b.shape[0]}"
            )
        if labels is not None and labels.shape != (a.shape[0],):
            raise CrlValueError(
                f"TensorPairDataset: `labels` must have shape ({a.shape[0]},); "
                f"got {tuple(labels.shape)}"
            )
        if hard is not None and (hard.dim() < 2 or hard.shape[0] != a.shape[0]
                                 or hard.shape[2:] != b.shape[1:]):
            raise CrlValueError(
                f"TensorPairDataset: `hard` must have shape ({a.shape[0]}, H, "
                f"{', '.join(map(str, b.shape[1:]))}) (view-b inputs); got {tuple(hard.shape)}"
            )
        super().__init__(labels)
        self.a = a
        self.b = b
        self.hard = hard  # (N, H, ...) or None

    def __len__(self) -> int:
        return int(self.a.shape[0])

    @property
    def num_hard_negatives(self) -> int:
        return 0 if self.hard is None else int(self.hard.shape[1])

    def _views(self, i: int) -> tuple[Tensor, Tensor]:
        return self.a[i], self.b[i]

    def _hard(self, i: int) -> Tensor:
        assert self.hard is not None
        return self.hard[i]  # (H, ...)

    def eval_views(self) -> tuple[Tensor, Tensor]:
        return self.a, self.b

    def hard_negative_views(self) -> Tensor | None:
        return self.hard

    def subset(self, indices: Sequence[int] | np.ndarray) -> TensorPairDataset:
        idx = np.asarray(indices, dtype=np.int64)
        t = torch.as_tensor(idx, dtype=torch.long)
        hard = None if self.hard is None else self.hard[t]
        return TensorPairDataset(self.a[t], self.b[t], self._subset_labels(idx), hard)


class TextPairDataset(PairDataset):
    """Paired texts (``str`` views); a model's ``prepare`` turns it into a tensor data set.

    Example:
        >>> ds = TextPairDataset(["add two numbers"], ["def add(x, y): return x + y"])
        >>> ds[0]
        ('add two numbers', 'def add(x, y): return x + y', 0, -1)
    """

    def __init__(self, a: Sequence[str], b: Sequence[str], labels: Tensor | None = None, *,
                 negatives: Sequence[Sequence[str]] | None = None) -> None:
        if len(a) != len(b):
            raise CrlValueError(
                f"TextPairDataset: `a` and `b` must have the same length; got {len(a)} and {len(b)}"
            )
        if labels is not None and labels.shape != (len(a),):
            raise CrlValueError(
                f"TextPairDataset: `labels` must have shape ({len(a)},); got {tuple(labels.shape)}"
            )
        if negatives is not None:
            widths = {len(row) for row in negatives}
            if len(negatives) != len(a) or (len(a) > 0 and (len(widths) != 1 or 0 in widths)):
                raise CrlValueError(
                    f"TextPairDataset: `negatives` must hold {len(a)} lists of the same number "
                    f"H >= 1 of texts; got {len(negatives)} lists of lengths {sorted(widths)}"
                )
        super().__init__(labels)
        self.a = list(a)
        self.b = list(b)
        self.negatives = None if negatives is None else [list(row) for row in negatives]

    @property
    def is_text(self) -> bool:
        return True

    @property
    def num_hard_negatives(self) -> int:
        return 0 if not self.negatives else len(self.negatives[0])

    def __len__(self) -> int:
        return len(self.a)

    def _views(self, i: int) -> tuple[str, str]:
        return self.a[i], self.b[i]

    def _hard(self, i: int) -> list[str]:
        assert self.negatives is not None
        return self.negatives[i]

    def eval_views(self) -> tuple[list[str], list[str]]:
        return list(self.a), list(self.b)

    def hard_negative_views(self) -> list[list[str]] | None:
        return None if self.negatives is None else [list(row) for row in self.negatives]

    def subset(self, indices: Sequence[int] | np.ndarray) -> TextPairDataset:
        idx = np.asarray(indices, dtype=np.int64)
        negatives = None if self.negatives is None else [self.negatives[i] for i in idx]
        return TextPairDataset([self.a[i] for i in idx], [self.b[i] for i in idx],
                               self._subset_labels(idx), negatives=negatives)


@dataclass
class DataSplits:
    """The train/validation/test splits of one data set and what models need to know about it."""

    train: PairDataset
    val: PairDataset
    test: PairDataset
    info: DataInfo
    #: Which items the splits hold (``config.json``'s ``data.split`` in a run directory): how
    #: they were made (``how``: ``drawn``, ``column`` or ``files``), ``num_train``, and for
    #: ``val`` and ``test`` the row indices in the data set or the file they were read from
    #: (``{"file": ..., "sha256": ...}``).
    record: dict[str, Any] = field(default_factory=dict)
