"""The mean of a batch's table rows as two sparse matrix products, with a sparse gradient of
only the rows the batch uses (the sparse path of
:class:`~crl.models.bag.EmbeddingBagEncoder`; docs/training.md, "Sparse embedding gradients").

A batch of ``B`` texts of ``L`` token ids touches ``U`` distinct rows of a ``(V, d)`` table,
``U`` a few thousand of ``V = 30,522``. With ``W`` the ``(B, U)`` matrix of each text's counts
of each row divided by its number of (non-pad) tokens (sparse CSR, about ``B L`` entries), the
bags are ``W @ T[rows]`` and the table's gradient is ``W^T @ G`` on ``rows``, zero elsewhere: a
sparse ``(V, d)`` tensor with one entry per row the batch uses, sorted.
``nn.EmbeddingBag(sparse=True)`` gives the same gradient as ``B L`` unsorted entries, one per
token, for the optimiser to sort and sum; here the ids are sorted once per batch, and the
:class:`BagRows` of a batch serve every run of a group (the same ids for all of them). The
products add in another order than ``nn.EmbeddingBag``'s loop: the bags agree to float rounding
(about 1e-7 relative in float32), not bit for bit.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

# torch warns once per process that CSR support is "beta"; the two products used here are tested
# (tests/models/test_models_bag_rows.py), and a study's workers would each print it.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta",
                        category=UserWarning)


@dataclass(frozen=True)
class BagRows:
    """The rows a batch of texts averages, computed once per batch.

    Attributes:
        rows: ``(U,)`` int64, the sorted distinct non-pad ids of the batch.
        weights: ``(B, U)`` sparse CSR: text ``b``'s count of ``rows[u]`` over its number of
            non-pad tokens (a text without tokens: an empty row, so its bag is zero).
        weights_t: ``(U, B)`` sparse CSR, the transpose (for the gradient).
    """

    rows: Tensor
    weights: Tensor
    weights_t: Tensor


#: The :class:`BagRows` computed inside :func:`shared_bag_rows`, by ids (None: outside).
_SHARED: dict[tuple[Any, ...], tuple[Tensor, BagRows]] | None = None


@contextmanager
def shared_bag_rows() -> Iterator[None]:
    """Inside the block, :func:`bag_rows` of the same ids (the same tensor memory, offset,
    shape, strides and version: unchanged since) is computed once: the runs of a group
    evaluate the same held-out batches, and finding their rows is most of encoding them. The
    ids seen are kept alive until the block ends (so their memory is not reused meanwhile).

    Example:
        >>> ids = torch.tensor([[5, 7, 5, 0]])
        >>> with shared_bag_rows():
        ...     bag_rows(ids, pad_id=0) is bag_rows(ids[:], pad_id=0)
        True
    """
    global _SHARED
    outer = _SHARED
    if outer is None:
        _SHARED = {}
    try:
        yield
    finally:
        if outer is None:
            _SHARED = None


def bag_rows(ids: Tensor, pad_id: int, dtype: torch.dtype = torch.float32) -> BagRows:
    """The :class:`BagRows` of token ids ``(B, L)`` (``pad_id`` left out of every mean): one
    sort of the batch's (id, text) pairs gives both sparse matrices; inside
    :func:`shared_bag_rows`, once per ids.

    Example:
        >>> r = bag_rows(torch.tensor([[5, 7, 5, 0], [0, 0, 0, 0]]), pad_id=0)
        >>> r.rows.tolist(), r.weights.to_dense().mul(3).round().tolist()
        ([5, 7], [[2.0, 1.0], [0.0, 0.0]])
    """
    if _SHARED is None:
        return _bag_rows(ids, pad_id, dtype)
    key = (ids.device, ids.untyped_storage().data_ptr(), ids.storage_offset(), tuple(ids.shape),
           ids.stride(), ids.dtype, ids._version, pad_id, dtype)
    if key not in _SHARED:
        _SHARED[key] = (ids, _bag_rows(ids, pad_id, dtype))
    return _SHARED[key][1]


def _bag_rows(ids: Tensor, pad_id: int, dtype: torch.dtype) -> BagRows:
    batch, length = ids.shape
    device = ids.device
    keep = ids != pad_id  # (B, L)
    texts = torch.arange(batch, device=device).unsqueeze(1).expand(batch, length)[keep]
    # (id, text) pairs sorted by id, then text: the transpose's CSR order
    pairs, counts = torch.unique_consecutive(_sorted(ids[keep].long() * batch + texts),
                                             return_counts=True)  # (P,), (P,)
    pair_ids, pair_texts = pairs.div(batch, rounding_mode="floor"), pairs.remainder(batch)
    rows, per_row = torch.unique_consecutive(pair_ids, return_counts=True)  # (U,), (U,)
    columns = torch.repeat_interleave(torch.arange(rows.numel(), device=device), per_row)
    tokens = keep.sum(dim=1).clamp_min(1).to(dtype)  # (B,)
    values = counts.to(dtype) / tokens[pair_texts]  # (P,)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    weights_t = torch.sparse_csr_tensor(torch.cat([zero, per_row.cumsum(0)]), pair_texts,
                                        values, (rows.numel(), batch), check_invariants=False)
    # rows ascending within a text: the stable order of the texts (unique keys: any sort)
    by_text = _argsort(pair_texts * pairs.numel() + torch.arange(pairs.numel(), device=device))
    per_text = torch.bincount(pair_texts, minlength=batch)
    weights = torch.sparse_csr_tensor(torch.cat([zero, per_text.cumsum(0)]),
                                      columns[by_text], values[by_text], (batch, rows.numel()),
                                      check_invariants=False)
    return BagRows(rows, weights, weights_t)


def _sorted(keys: Tensor) -> Tensor:
    """``keys (N,)`` int64 in ascending order: numpy's sort on the CPU (its vectorised sort
    takes about a tenth of ``torch.sort``'s time for a batch's 10,000 keys), ``torch.sort``
    elsewhere; the same values either way."""
    if keys.device.type != "cpu":
        return torch.sort(keys).values
    return torch.from_numpy(np.sort(keys.numpy()))


def _argsort(keys: Tensor) -> Tensor:
    """The permutation that sorts distinct ``keys (N,)`` int64 (distinct: one answer, whatever
    the sort), as :func:`_sorted` chooses the sort."""
    if keys.device.type != "cpu":
        return torch.argsort(keys)
    return torch.from_numpy(np.argsort(keys.numpy()))


class _GatheredMean(torch.autograd.Function):
    """``W @ T[rows]``, with the gradient ``W^T G`` on ``rows`` as a coalesced sparse tensor."""

    @staticmethod
    def forward(ctx: Any, table: Tensor, rows: Tensor, weights: Tensor,
                weights_t: Tensor) -> Tensor:
        ctx.save_for_backward(rows, weights_t)
        ctx.table_shape = table.shape
        return weights.to(table.dtype) @ table.index_select(0, rows)  # (B, d)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        rows, weights_t = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        values = weights_t.to(grad.dtype) @ grad.contiguous()  # (U, d)
        table_grad = torch.sparse_coo_tensor(rows.unsqueeze(0), values, ctx.table_shape,
                                             is_coalesced=True, check_invariants=False)
        return table_grad, None, None, None


def gathered_mean(table: Tensor, rows: BagRows) -> Tensor:
    """The bags ``(B, d)`` of a batch: each text's mean of its rows of ``table (V, d)``; the
    table's gradient is sparse on ``rows.rows`` (module docstring)."""
    out: Tensor = _GatheredMean.apply(  # type: ignore[no-untyped-call]
        table, rows.rows, rows.weights, rows.weights_t)
    return out


__all__ = ["BagRows", "bag_rows", "gathered_mean", "shared_bag_rows"]
