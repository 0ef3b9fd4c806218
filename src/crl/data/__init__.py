"""Data sets that yield ``(view_a, view_b, index, label)`` pairs, with deterministic splits.

- ``synthetic``: the closed-form models of docs/theory.md §2.
- ``digits``: scikit-learn's 8x8 digits with two augmented views (and a long-tailed variant).
- ``pycode``: docstring-to-code pairs mined from the installed Python sources.
- ``files``: a user's ``.npz`` vectors, or texts in ``.jsonl``, ``.csv``/``.tsv``, ``.parquet`` or
  a ``datasets`` ``save_to_disk`` directory, through a column map (with hard negatives).

Example:
    >>> splits = load_data(DataConfig(name="digits"))
    >>> view_a, view_b, index, label = splits.train[0]
    >>> view_a.shape, splits.info.num_classes
    (torch.Size([1, 8, 8]), 10)
"""

from crl.data.base import DataInfo, DataSplits, PairDataset, TensorPairDataset, TextPairDataset
from crl.data.cache import resolve_cache_dir
from crl.data.config import (
    ColumnsConfig,
    DataConfig,
    DigitsConfig,
    FilesConfig,
    PycodeConfig,
    SyntheticConfig,
)
from crl.data.digits import AugmentedImageDataset
from crl.data.load import class_counts, load_data
from crl.data.synthetic import synthetic_model

__all__ = [
    "AugmentedImageDataset",
    "ColumnsConfig",
    "DataConfig",
    "DataInfo",
    "DataSplits",
    "DigitsConfig",
    "FilesConfig",
    "PairDataset",
    "PycodeConfig",
    "SyntheticConfig",
    "TensorPairDataset",
    "TextPairDataset",
    "class_counts",
    "load_data",
    "resolve_cache_dir",
    "synthetic_model",
]
