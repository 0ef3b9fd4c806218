"""``load_data(cfg)``: one entry point for every data set, returning its splits; each data set
declared once in :data:`DATA_SETS` with its loader and, when it keeps an on-disk cache, the hook
that fills it (:func:`crl.data.cache.prepare_data_caches`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from pydantic import BaseModel

from crl.data.base import DataInfo, DataSplits, PairDataset, TensorPairDataset, TextPairDataset
from crl.data.config import DataConfig
from crl.data.digits import AugmentedImageDataset, load_digit_images
from crl.data.files import load_pair_file, read_split_column
from crl.data.pycode import load_pycode_pairs
from crl.data.splits import long_tail_subset, split_by_column, split_indices, train_order
from crl.data.synthetic import sample_synthetic
from crl.errors import CrlValueError


def _indices(full: PairDataset, cfg: DataConfig, info: DataInfo, long_tail: float = 1.0,
             parts: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
             test_fraction: float | None = None, val_fraction: float | None = None,
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(train in training order, val, test)`` row indices of ``full``: ``parts`` when given
    (a split column), else drawn with ``cfg.split_seed``."""
    labels = None if full.labels is None else full.labels.numpy()
    if parts is None:
        parts = split_indices(len(full), cfg.val_fraction if val_fraction is None else val_fraction,
                              cfg.test_fraction if test_fraction is None else test_fraction,
                              cfg.split_seed, labels)
    train, val, test = parts
    if long_tail > 1.0:
        if labels is None:
            raise CrlValueError("load_data: an imbalance ratio needs labelled data")
        train = long_tail_subset(train, labels, long_tail, cfg.split_seed)
    if len(train) == 0:
        raise CrlValueError(
            f"load_data: the training split of {info.name!r} is empty ({len(full)} pairs, "
            f"val_fraction={cfg.val_fraction}, test_fraction={cfg.test_fraction})"
        )
    return train_order(train, cfg.seed, cfg.num_train), val, test


def _record(how: str, train: np.ndarray, val: Any, test: Any, **extra: Any) -> dict[str, Any]:
    """What :attr:`DataSplits.record` says: how the split was made, the size of the training
    split, and the rows (or the file) of the validation and test splits."""
    def part(p: Any) -> Any:
        return p.tolist() if isinstance(p, np.ndarray) else p

    return {"how": how, **extra, "num_train": len(train), "val": part(val), "test": part(test)}


def _splits(full: PairDataset, cfg: DataConfig, info: DataInfo,
            long_tail: float = 1.0) -> DataSplits:
    train, val, test = _indices(full, cfg, info, long_tail)
    record = _record("drawn", train, val, test, split_seed=cfg.split_seed,
                     val_fraction=cfg.val_fraction, test_fraction=cfg.test_fraction)
    return DataSplits(full.subset(train), full.subset(val), full.subset(test), info, record)


def _num_classes(labels: torch.Tensor | None) -> int | None:
    return None if labels is None else int(labels.max()) + 1


def _load_synthetic(cfg: DataConfig, progress: bool) -> DataSplits:
    a, b, labels = sample_synthetic(cfg.synthetic, cfg.split_seed)
    info = DataInfo("vector", a.shape[1], b.shape[1], None, _num_classes(labels), "synthetic",
                    {"model": cfg.synthetic.model_dump(), "seed": cfg.split_seed})
    return _splits(TensorPairDataset(a, b, labels), cfg, info)


def _load_digits(cfg: DataConfig, progress: bool) -> DataSplits:
    images, digit_labels = load_digit_images()
    info = DataInfo("image", None, None, tuple(images.shape[1:]), 10, "digits",
                    {"source": "sklearn.datasets.load_digits",
                     "imbalance_ratio": cfg.digits.imbalance_ratio})
    full = AugmentedImageDataset(images, digit_labels, cfg.digits, cfg.seed)
    return _splits(full, cfg, info, cfg.digits.imbalance_ratio)


def _load_pycode(cfg: DataConfig, progress: bool) -> DataSplits:
    mined = load_pycode_pairs(cfg.pycode, progress=progress)
    if len(mined.pairs) < 2:
        raise CrlValueError(
            f"pycode: found {len(mined.pairs)} docstring-code pair(s) under "
            f"{list(mined.provenance['roots'].values())}; need at least 2"
        )
    text = TextPairDataset([p.doc for p in mined.pairs], [p.code for p in mined.pairs])
    info = DataInfo("text", None, None, None, None, "pycode", mined.provenance)
    return _splits(text, cfg, info)


def _load_files(cfg: DataConfig, progress: bool) -> DataSplits:
    files = cfg.files
    if files.path is None:
        raise CrlValueError("load_data: data `files` needs `files.path` (a .npz, .jsonl, .csv, "
                            ".tsv or .parquet file, or a datasets save_to_disk directory)")
    dataset, provenance = load_pair_file(files.path, files.columns)
    held: dict[str, tuple[PairDataset, dict[str, Any]]] = {
        name: load_pair_file(path, files.columns)
        for name, path in (("val", files.val_path), ("test", files.test_path)) if path}
    if held:
        provenance = {**provenance, **{f"{name}_path": p for name, (_, p) in held.items()}}
    if isinstance(dataset, TensorPairDataset):
        info = DataInfo("vector", int(dataset.a.shape[1]), int(dataset.b.shape[1]), None,
                        _num_classes(dataset.labels), "files", provenance)
    else:
        info = DataInfo("text", None, None, None, _num_classes(dataset.labels), "files",
                        provenance)
    for part in [dataset, *(d for d, _ in held.values())]:
        if part.labels is not None and int(part.labels.min()) < 0:
            raise CrlValueError(
                f"files: labels must be non-negative class ids; got {int(part.labels.min())}")
    if files.split_column is not None:
        if isinstance(dataset, TensorPairDataset):
            raise CrlValueError("files: data.files.split_column needs a table of texts; a .npz "
                                "has no columns (use val_path/test_path)")
        parts = split_by_column(*read_split_column(files.path, files.split_column))
        train, val, test = _indices(dataset, cfg, info, parts=parts)
        record = _record("column", train, val, test, split_column=files.split_column)
        return DataSplits(dataset.subset(train), dataset.subset(val), dataset.subset(test),
                          info, record)
    if not held:
        return _splits(dataset, cfg, info)
    train, val, test = _indices(dataset, cfg, info, test_fraction=0.0 if "test" in held else None,
                                val_fraction=0.0 if "val" in held else None)
    sources = {name: {"file": p["path"], "sha256": p["sha256"]} for name, (_, p) in held.items()}
    record = _record("files", train, sources.get("val", val), sources.get("test", test),
                     split_seed=cfg.split_seed)
    return DataSplits(dataset.subset(train),
                      held["val"][0] if "val" in held else dataset.subset(val),
                      held["test"][0] if "test" in held else dataset.subset(test), info, record)


class CacheHook(NamedTuple):
    """How a data set fills its on-disk cache before the runs that read it start
    (:func:`crl.data.cache.prepare_data_caches`).

    Attributes:
        options: The data set's own section of a data config; configs with equal sections
            share one cache, filled once.
        fill: ``fill(options, progress)`` makes the cache of ``options`` present on disk.
    """

    options: Callable[[DataConfig], BaseModel]
    fill: Callable[[Any, bool], object]


class DataSet(NamedTuple):
    """One data set: ``load(cfg, progress)`` gives its splits; ``cache`` fills its on-disk
    cache (None for a data set without one)."""

    load: Callable[[DataConfig, bool], DataSplits]
    cache: CacheHook | None = None


#: Every data set, by ``DataConfig.name``.
DATA_SETS: dict[str, DataSet] = {
    "synthetic": DataSet(_load_synthetic),
    "digits": DataSet(_load_digits),
    # the mined pairs, cached once per distinct `pycode` section (mined under a file lock)
    "pycode": DataSet(_load_pycode, CacheHook(lambda cfg: cfg.pycode, load_pycode_pairs)),
    "files": DataSet(_load_files),
}


def load_data(cfg: DataConfig, *, progress: bool = True) -> DataSplits:
    """Load the data set of ``cfg`` and split it into train/val/test.

    Splits are disjoint and depend only on ``cfg.split_seed`` (stratified by class for labelled
    data); the training split is ordered by ``cfg.seed`` and cut to ``cfg.num_train``.

    Args:
        cfg: The data section of a run config.
        progress: Show a progress bar while mining ``pycode`` (the first time only; then cached).

    Returns:
        The splits and a :class:`DataInfo`.

    Raises:
        CrlValueError: for a missing or malformed file, an empty root or too few pairs.
        FileNotFoundError: if ``cfg.files.path`` does not exist.

    Example:
        >>> splits = load_data(DataConfig(name="synthetic", num_train=100))
        >>> len(splits.train), len(splits.val), len(splits.test), splits.info.dim_a
        (100, 410, 819, 2)
    """
    return DATA_SETS[cfg.name].load(cfg, progress)


def class_counts(dataset: PairDataset) -> np.ndarray:
    """Number of items per class (index = label) of a labelled data set.

    Example:
        >>> splits = load_data(DataConfig(name="digits", digits={"imbalance_ratio": 10}))
        >>> counts = class_counts(splits.train)
        >>> int(counts[0]) // int(counts[-1])
        10
    """
    if dataset.labels is None:
        raise CrlValueError("class_counts: the data set has no labels")
    return np.bincount(dataset.labels.numpy())
