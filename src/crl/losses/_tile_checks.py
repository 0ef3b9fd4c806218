"""Checks and conversions of the tiled primitives' arguments (:mod:`crl.losses.tiled`)."""

from __future__ import annotations

import torch
from torch import Tensor

from crl import _validation
from crl._validation import check_positive, check_tensor, describe
from crl.errors import CrlValueError
from crl.losses._tiled_kernel import accumulation_dtype


def check_index(where: str, name: str, index: object, length: int,
                device: torch.device) -> Tensor:
    """``index`` checked as ``(length,)`` integer dataset indices
    (:func:`crl._validation.check_index`), on ``device``."""
    return _validation.check_index(where, name, index, length=length).to(device)


def check_row_counts(where: str, counts: Tensor) -> None:
    """Every anchor needs a negative (``counts`` include the positive, hence ``< 2``)."""
    empty = (counts < 2).nonzero().flatten()
    if empty.numel() > 0:
        first = [int(i) for i in empty[:5]]
        raise CrlValueError(f"{where}: every row of `negatives_mask` needs at least one negative; "
                            f"{empty.numel()} row(s) have none (first: {first})")


def scale_tensor(where: str, name: str, value: object, rows: int, dtype: torch.dtype,
                  device: torch.device, *, per_anchor: bool, check: bool = True) -> Tensor:
    """``value`` (a positive number, 0-dim tensor or, when ``per_anchor``, ``(rows,)`` tensor of
    positive entries) as a tensor of ``dtype`` on ``device``, gradients kept; checked unless
    ``check`` is False."""
    if per_anchor and isinstance(value, Tensor) and value.dim() == 1:
        if not check:
            return value.to(device=device, dtype=dtype)
        check_tensor(where, name, value, ndim=1)
        if value.shape[0] != rows or not bool((value > 0).all()):
            raise CrlValueError(f"{where}: a 1-D `{name}` must have shape ({rows},) and positive "
                                f"entries; got {describe(value)}")
        return value.to(device=device, dtype=dtype)
    if check:
        check_positive(where, name, value)
    if isinstance(value, Tensor):
        return value.reshape(()).to(device=device, dtype=dtype)
    return torch.tensor(float(value), dtype=dtype, device=device)  # type: ignore[arg-type]


def tile_dtypes(*xs: Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(products, accumulation) dtypes of embeddings ``xs``."""
    dtype = xs[0].dtype
    for x in xs[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    return dtype, accumulation_dtype(dtype)


def check_anchor_inputs(where: str, anchors: object, candidates: object, offset: object,
                         extra: object) -> None:
    """The checks of :func:`anchor_logsumexp`'s embeddings, ``offset`` and ``extra``."""
    anchors = check_tensor(where, "anchors", anchors, ndim=2)
    candidates = check_tensor(where, "candidates", candidates, ndim=2)
    h, width = anchors.shape[0], candidates.shape[0]
    if anchors.shape[1] != candidates.shape[1] or anchors.device != candidates.device:
        raise CrlValueError(
            f"{where}: `anchors` and `candidates` must have the same width D and device; got "
            f"{describe(anchors)} and {describe(candidates)}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 \
            or offset + h > width or h == 0:
        raise CrlValueError(
            f"{where}: `offset` must be an int in [0, W - h] = [0, {width - h}] so that every "
            f"anchor's positive (column offset + i) is a candidate, with h >= 1; got "
            f"offset={offset!r} for h = {h} anchors and W = {width} candidates")
    if extra is not None:
        extra = check_tensor(where, "extra", extra, ndim=3)
        if extra.shape[0] != h or extra.shape[2] != anchors.shape[1] \
                or extra.device != anchors.device:
            raise CrlValueError(f"{where}: `extra` must have shape (h, H, D) = ({h}, H, "
                                f"{anchors.shape[1]}) on {anchors.device}; got {describe(extra)}")


__all__ = ["check_anchor_inputs", "check_index", "check_row_counts", "scale_tensor", "tile_dtypes"]
