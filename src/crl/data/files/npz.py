"""A user's vector pairs: a ``.npz`` with arrays ``a (N, D_a)``, ``b (N, D_b)`` and optional
integer ``labels (N,)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from crl.data.base import TensorPairDataset
from crl.errors import CrlValueError


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


def load_npz(path: Path) -> TensorPairDataset:
    """The pairs of a ``.npz`` file (see the module docstring)."""
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
        if arr.shape[1] == 0:
            raise CrlValueError(
                f"{where}: array {key!r} has shape {arr.shape}: vectors of 0 values, which no "
                "model can tell apart; save each pair's vectors as rows of D >= 1 values"
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
