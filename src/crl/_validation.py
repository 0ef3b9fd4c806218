"""Input checks shared by the public functions.

Each check raises :class:`~crl.errors.CrlValueError` or :class:`~crl.errors.CrlTypeError` with a
message of the form ``"<where>: <argument> must be <expected>; got <received>"``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from crl.errors import CrlTypeError, CrlValueError

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def clip_text(text: str, limit: int = 200) -> str:
    """``text`` on one line and at most ``limit`` characters (``...`` where it was cut), so that
    a message never quotes a whole document.

    Example:
        >>> clip_text("a\\n b" + "c" * 300, 8)
        'a bcc...'
    """
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe(value: Any) -> str:
    """A short description of ``value`` for error messages."""
    if isinstance(value, Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_tensor(where: str, name: str, x: Any, *, ndim: int | None = None,
                 floating: bool = True, finite: bool = True) -> Tensor:
    """Check that ``x`` is a tensor of rank ``ndim`` (floating and finite by default)."""
    if not isinstance(x, Tensor):
        raise CrlTypeError(f"{where}: `{name}` must be a torch.Tensor; got {describe(x)}")
    if ndim is not None and x.dim() != ndim:
        raise CrlValueError(
            f"{where}: `{name}` must be a {ndim}-D tensor; got shape {tuple(x.shape)}"
        )
    if floating and not x.is_floating_point():
        raise CrlTypeError(
            f"{where}: `{name}` must have a floating dtype; got {x.dtype} "
            "(convert with .float())"
        )
    if finite and floating and x.numel() > 0 and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise CrlValueError(
            f"{where}: `{name}` must be finite; got {bad} NaN/Inf value(s) "
            f"in a tensor of shape {tuple(x.shape)}"
        )
    return x


def check_pair(where: str, a: Any, b: Any, *, min_rows: int = 2,
               names: tuple[str, str] = ("a", "b")) -> tuple[Tensor, Tensor]:
    """Check paired embeddings ``a (B, D)`` and ``b (B, D)``: same shape, ``B >= min_rows``."""
    a = check_tensor(where, names[0], a, ndim=2)
    b = check_tensor(where, names[1], b, ndim=2)
    if a.shape != b.shape:
        raise CrlValueError(
            f"{where}: `{names[0]}` and `{names[1]}` must have the same shape (B, D); "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.shape[0] < min_rows:
        raise CrlValueError(
            f"{where}: need a batch of at least {min_rows} pairs (B >= {min_rows}) so every "
            f"anchor has a negative; got B = {a.shape[0]}"
        )
    if a.device != b.device:
        raise CrlValueError(
            f"{where}: `{names[0]}` and `{names[1]}` must be on the same device; "
            f"got {a.device} and {b.device}"
        )
    return a, b


def check_positive(where: str, name: str, value: Any, *, allow_tensor: bool = True) -> None:
    """Check that ``value`` (a number or a 0-dim tensor) is finite and > 0."""
    if isinstance(value, Tensor):
        if not allow_tensor:
            raise CrlTypeError(f"{where}: `{name}` must be a number; got {describe(value)}")
        if value.numel() != 1:
            raise CrlValueError(
                f"{where}: `{name}` must be a scalar (0-dim tensor); got shape {tuple(value.shape)}"
            )
        v = float(value.detach())
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CrlTypeError(f"{where}: `{name}` must be a positive number; got {describe(value)}")
    else:
        v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise CrlValueError(f"{where}: `{name}` must be positive and finite; got {v}")


def check_finite_scalar(where: str, name: str, value: Any) -> None:
    """Check that ``value`` (a number or a 0-dim tensor) is finite."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise CrlValueError(
                f"{where}: `{name}` must be a scalar (0-dim tensor); got shape {tuple(value.shape)}"
            )
        v = float(value.detach())
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CrlTypeError(f"{where}: `{name}` must be a number; got {describe(value)}")
    else:
        v = float(value)
    if not math.isfinite(v):
        raise CrlValueError(f"{where}: `{name}` must be finite; got {v}")


def check_choice(where: str, name: str, value: Any, choices: Iterable[str]) -> str:
    """Check that ``value`` is one of ``choices`` (listed in the message)."""
    options = list(choices)
    if value not in options:
        raise CrlValueError(
            f"{where}: unknown {name} {value!r}; valid values are "
            + ", ".join(repr(c) for c in options)
        )
    return str(value)


def check_int_range(where: str, name: str, value: Any, low: int, high: int | None) -> int:
    """Check that ``value`` is an int with ``low <= value <= high`` (``high=None``: unbounded)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CrlTypeError(f"{where}: `{name}` must be an integer; got {describe(value)}")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise CrlValueError(f"{where}: `{name}` must be in {bound}; got {value}")
    return value


def check_rows(where: str, rows: Any, batch: int) -> slice:
    """``rows`` (a batch's anchors) checked: ``slice(start, stop)`` with explicit integer
    bounds, ``0 <= start < stop <= batch`` and step 1; None means every row."""
    if rows is None:
        return slice(0, batch)
    if isinstance(rows, slice) and rows.step in (None, 1) and isinstance(rows.start, int) \
            and isinstance(rows.stop, int) and 0 <= rows.start < rows.stop <= batch:
        return slice(rows.start, rows.stop)
    raise CrlValueError(f"{where}: `rows` must be a non-empty contiguous slice(start, stop) of "
                        f"the batch of {batch}, within [0, {batch}]; got {rows!r}")


def check_index(where: str, name: str, index: Any, *, length: int | None = None,
                num_samples: int | None = None, distinct: bool = False) -> Tensor:
    """``index`` checked as 1-D integer dataset indices (as int64): of ``length`` entries when
    given, in ``[0, num_samples)`` when given, without repeats when ``distinct``."""
    if not isinstance(index, Tensor):
        raise CrlTypeError(f"{where}: `{name}` must be a torch.Tensor; got {describe(index)}")
    if index.dtype.is_floating_point or index.dtype == torch.bool or index.is_complex():
        raise CrlTypeError(f"{where}: `{name}` must have an integer dtype; got {index.dtype}")
    if index.dim() != 1 or (length is not None and index.shape[0] != length):
        expected = f"({length},)" if length is not None else "1-D (B,)"
        raise CrlValueError(f"{where}: `{name}` must have shape {expected} (one dataset index "
                            f"per row); got {tuple(index.shape)}")
    out: Tensor = index.to(torch.int64)
    if num_samples is not None and out.numel() > 0:
        low, high = int(out.min()), int(out.max())
        if low < 0 or high >= num_samples:
            raise CrlValueError(f"{where}: `{name}` must hold dataset indices in "
                                f"[0, {num_samples - 1}]; got values in [{low}, {high}]")
    if distinct:
        repeats = out.numel() - torch.unique(out).numel()
        if repeats:
            raise CrlValueError(f"{where}: `{name}` must not repeat a sample within a batch; "
                                f"got {out.numel()} indices with {repeats} duplicate(s)")
    return out


def check_hard(where: str, hard: Any, a: Tensor) -> Tensor:
    """Hard negatives ``(B, H, D)`` checked against the embeddings ``a (B, D)``: finite floats
    of matching batch, width and device (``H >= 0``)."""
    out = check_tensor(where, "hard", hard, ndim=3)
    if out.shape[0] != a.shape[0] or out.shape[2] != a.shape[1] or out.device != a.device:
        raise CrlValueError(f"{where}: `hard` must have shape (B, H, D) = ({a.shape[0]}, H, "
                            f"{a.shape[1]}) on {a.device}, H hard negatives per anchor; got "
                            f"{describe(out)} on {out.device}")
    return out


def check_mask(where: str, name: str, mask: Any, shape: Sequence[int], *,
               need_true_per_row: bool = True, ignore_diagonal: bool = False) -> Tensor:
    """Check a boolean mask of ``shape`` in which every row has at least one True entry."""
    if not isinstance(mask, Tensor):
        raise CrlTypeError(f"{where}: `{name}` must be a bool torch.Tensor; got {describe(mask)}")
    if mask.dtype != torch.bool:
        raise CrlTypeError(f"{where}: `{name}` must have dtype torch.bool; got {mask.dtype}")
    if tuple(mask.shape) != tuple(shape):
        raise CrlValueError(
            f"{where}: `{name}` must have shape {tuple(shape)}; got {tuple(mask.shape)}"
        )
    if need_true_per_row and mask.numel() > 0:
        rows = mask
        if ignore_diagonal:
            eye = torch.eye(shape[0], shape[1], dtype=torch.bool, device=mask.device)
            rows = mask & ~eye
        empty = (~rows.any(dim=1)).nonzero().flatten()
        if empty.numel() > 0:
            first = [int(i) for i in empty[:5]]
            raise CrlValueError(
                f"{where}: every row of `{name}` needs at least one negative; "
                f"{empty.numel()} row(s) have none (first: {first})"
            )
    return mask


def compute_dtype(*xs: Tensor) -> torch.dtype:
    """The dtype losses compute in: float32 for half-precision inputs, else the input dtype."""
    dtype = torch.promote_types(xs[0].dtype, xs[-1].dtype) if xs else torch.float32
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def upcast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` in ``dtype`` (a no-op when it already is)."""
    return x if x.dtype == dtype else x.to(dtype)
