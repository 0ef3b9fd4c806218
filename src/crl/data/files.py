"""A user's own pairs: ``.npz`` arrays (vectors) or ``.jsonl`` records (texts)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from crl.data.base import PairDataset, TensorPairDataset, TextPairDataset
from crl.errors import CrlValueError

SUPPORTED_SUFFIXES = (".npz", ".jsonl")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _labels(where: str, values: Any, n: int) -> Tensor:
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise CrlValueError(
            f"{where}: labels must have one entry per pair, shape ({n},); got shape {arr.shape}"
        )
    if arr.dtype.kind not in "iub":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise CrlValueError(f"{where}: labels must be integers; got dtype {arr.dtype}")
    return torch.as_tensor(arr.astype(np.int64))


def _load_npz(path: Path) -> PairDataset:
    where = f"files: {path}"
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (ValueError, OSError) as exc:
        raise CrlValueError(f"{where}: not a readable .npz file ({exc})") from None
    for key in ("a", "b"):
        if key not in arrays:
            raise CrlValueError(
                f"{where}: missing array {key!r}; the file holds {sorted(arrays) or 'no arrays'} "
                "(expected 'a', 'b' and optionally 'labels')"
            )
    a, b = arrays["a"], arrays["b"]
    for key, arr in (("a", a), ("b", b)):
        if arr.ndim != 2 or arr.dtype.kind not in "fiu":
            raise CrlValueError(
                f"{where}: array {key!r} must be a 2-D numeric array (N, D); "
                f"got shape {arr.shape} and dtype {arr.dtype}"
            )
        if not np.all(np.isfinite(arr)):
            raise CrlValueError(f"{where}: array {key!r} has NaN or Inf values")
    if a.shape[0] != b.shape[0]:
        raise CrlValueError(
            f"{where}: 'a' and 'b' must have the same number of rows; got {a.shape[0]} and "
            f"{b.shape[0]}"
        )
    if a.shape[0] == 0:
        raise CrlValueError(f"{where}: the file holds no pairs ('a' has 0 rows)")
    labels = _labels(where, arrays["labels"], a.shape[0]) if "labels" in arrays else None
    return TensorPairDataset(torch.as_tensor(a, dtype=torch.float32),
                             torch.as_tensor(b, dtype=torch.float32), labels)


def _load_jsonl(path: Path) -> PairDataset:
    where = f"files: {path}"
    texts_a: list[str] = []
    texts_b: list[str] = []
    labels: list[int] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CrlValueError(
                    f"{where}: line {lineno} is not valid JSON ({exc.msg})"
                ) from None
            if not isinstance(record, dict):
                raise CrlValueError(
                    f"{where}: line {lineno} must be a JSON object with text fields 'a' and 'b'; "
                    f"got {type(record).__name__}"
                )
            for key in ("a", "b"):
                if not isinstance(record.get(key), str):
                    raise CrlValueError(
                        f"{where}: line {lineno} needs a text field {key!r}; "
                        f"got keys {sorted(record)}"
                    )
            has_label = "label" in record
            if texts_a and has_label != bool(labels):
                raise CrlValueError(
                    f"{where}: line {lineno}: either every line has a 'label' or none does"
                )
            if has_label:
                label = record["label"]
                if isinstance(label, bool) or not isinstance(label, int):
                    raise CrlValueError(
                        f"{where}: line {lineno}: 'label' must be an integer; got {label!r}"
                    )
                labels.append(label)
            texts_a.append(record["a"])
            texts_b.append(record["b"])
    if not texts_a:
        raise CrlValueError(f"{where}: the file holds no pairs")
    label_tensor = torch.tensor(labels, dtype=torch.long) if labels else None
    return TextPairDataset(texts_a, texts_b, label_tensor)


def load_pair_file(path: str | Path) -> tuple[PairDataset, dict[str, Any]]:
    """Load the pairs of ``path`` and its provenance (path, size, sha256).

    Args:
        path: A ``.npz`` with float arrays ``a (N, D_a)``, ``b (N, D_b)`` and optional integer
            ``labels (N,)``, or a ``.jsonl`` with one object per line holding text fields ``a``,
            ``b`` and an optional integer ``label``.

    Returns:
        The whole file as one data set, and its provenance.

    Raises:
        FileNotFoundError: if the file does not exist.
        CrlValueError: for an unsupported extension, an empty file, a missing array or field,
            mismatched lengths, labels of the wrong length or a malformed line (with its number).
    """
    p = Path(path).expanduser()
    if p.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise CrlValueError(
            f"files: unsupported file type {p.suffix or '(no extension)'!r} of {p}; supported: "
            + ", ".join(SUPPORTED_SUFFIXES)
        )
    if not p.is_file():
        raise FileNotFoundError(f"files: no such file {p}")
    if p.stat().st_size == 0:
        raise CrlValueError(f"files: {p} is empty")
    dataset = _load_npz(p) if p.suffix.lower() == ".npz" else _load_jsonl(p)
    provenance = {"path": str(p.resolve()), "bytes": p.stat().st_size, "sha256": _sha256(p)}
    return dataset, provenance
