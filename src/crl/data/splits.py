"""Deterministic train/validation/test splits, nested training subsets and long-tail subsampling.

All randomness comes from ``numpy.random.default_rng([seed, stream])`` so a split depends only on
its seed, never on the global RNG or the number of processes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from crl.errors import CrlValueError

# Independent random streams derived from one seed.
_SPLIT_STREAM = 1
_ORDER_STREAM = 2
_LONG_TAIL_STREAM = 3


def split_indices(n: int, val_fraction: float, test_fraction: float, seed: int,
                  labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint train/val/test index arrays covering ``range(n)``, each sorted.

    With ``labels``, the split is stratified: each class contributes ``round(fraction * n_c)``
    items to val and to test.

    Args:
        n: Number of items.
        val_fraction, test_fraction: Shares held out.
        seed: Split seed.
        labels: Optional ``(n,)`` integer class labels.

    Returns:
        ``(train, val, test)`` int64 index arrays.

    Example:
        >>> train, val, test = split_indices(10, 0.2, 0.3, seed=0)
        >>> len(train), len(val), len(test)
        (5, 2, 3)
        >>> sorted(np.concatenate([train, val, test]).tolist()) == list(range(10))
        True
    """
    rng = np.random.default_rng([seed, _SPLIT_STREAM])
    groups = [np.arange(n)] if labels is None else [
        np.flatnonzero(labels == c) for c in np.unique(labels)
    ]
    train, val, test = [], [], []
    for group in groups:
        perm = group[rng.permutation(len(group))]
        n_test = round(test_fraction * len(group))
        n_val = round(val_fraction * len(group))
        test.append(perm[:n_test])
        val.append(perm[n_test:n_test + n_val])
        train.append(perm[n_test + n_val:])
    return tuple(np.sort(np.concatenate(part)).astype(np.int64)  # type: ignore[return-value]
                 for part in (train, val, test))


#: The cells of a split column, and the split each names.
SPLIT_NAMES = {"train": "train", "val": "val", "validation": "val", "dev": "val", "test": "test"}


def split_by_column(values: Sequence[object], rows: Sequence[str]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(train, val, test)`` sorted int64 index arrays from each row's split name.

    Args:
        values: One cell per row: ``train``, ``val`` (or ``validation``, ``dev``) or ``test``
            (any case, surrounding spaces ignored).
        rows: How each row is named in an error.

    Raises:
        CrlValueError: for another value, naming the row.

    Example:
        >>> [p.tolist() for p in split_by_column(["test", "train", "Dev", "train"], list("abcd"))]
        [[1, 3], [2], [0]]
    """
    parts: dict[str, list[int]] = {"train": [], "val": [], "test": []}
    for i, value in enumerate(values):
        name = SPLIT_NAMES.get(str(value).strip().lower()) if value is not None else None
        if name is None:
            raise CrlValueError(f"{rows[i]}: the split must be one of "
                                f"{', '.join(SPLIT_NAMES)}; got {value!r}")
        parts[name].append(i)
    return tuple(np.asarray(parts[k], dtype=np.int64)  # type: ignore[return-value]
                 for k in ("train", "val", "test"))


def train_order(train: np.ndarray, seed: int, num_train: int | None) -> np.ndarray:
    """The training indices in a seeded order, cut to the first ``num_train``.

    Subsets for growing ``num_train`` are nested (the same seed gives the same order).

    Example:
        >>> idx = np.arange(100)
        >>> small, large = train_order(idx, 0, 10), train_order(idx, 0, 50)
        >>> bool((large[:10] == small).all())
        True
    """
    order = train[np.random.default_rng([seed, _ORDER_STREAM]).permutation(len(train))]
    if num_train is None:
        return order
    if num_train > len(order):
        raise CrlValueError(
            f"load_data: `num_train` must be at most the size of the training split "
            f"({len(order)}); got {num_train}"
        )
    return order[:num_train]


def long_tail_counts(n_max: int, num_classes: int, imbalance_ratio: float) -> list[int]:
    """Class sizes decaying exponentially from ``n_max`` (class 0) to ``n_max / imbalance_ratio``.

    ``n_c = round(n_max * r^(-c / (C - 1)))``, at least 1.

    Example:
        >>> long_tail_counts(100, 3, 10.0)
        [100, 32, 10]
    """
    if num_classes == 1:
        return [n_max]
    return [max(1, round(n_max * imbalance_ratio ** (-c / (num_classes - 1))))
            for c in range(num_classes)]


def long_tail_subset(indices: np.ndarray, labels: np.ndarray, imbalance_ratio: float,
                     seed: int) -> np.ndarray:
    """Subsample ``indices`` (with class ``labels[indices]``) to a long-tailed class distribution.

    The first class (in sorted label order) becomes the most frequent and keeps all its ``n_max``
    items; class ``c`` keeps a seeded random ``long_tail_counts(n_max, C, r)[c]`` of its items (all
    it has when it has fewer).

    Returns:
        The kept indices, sorted.
    """
    classes = np.unique(labels[indices])
    n_max = int((labels[indices] == classes[0]).sum())
    counts = long_tail_counts(n_max, len(classes), imbalance_ratio)
    rng = np.random.default_rng([seed, _LONG_TAIL_STREAM])
    kept = []
    for c, count in zip(classes, counts, strict=True):
        members = indices[labels[indices] == c]
        kept.append(members[rng.permutation(len(members))[:count]])
    return np.sort(np.concatenate(kept)).astype(np.int64)
