"""The gradient-cached step (``train.micro_batch_size: k`` or ``train.micro_batch_tokens: N``,
as GradCache and sentence-transformers' ``CachedMultipleNegativesRankingLoss``).

The towers embed micro-batches without the graph; the loss and its gradient with respect to the
embeddings are computed on the full batch; then each micro-batch is embedded again with the
graph, replaying the RNG state of its first pass (dropout draws the same masks), and
back-propagates its rows of the cached gradient. The loss and the parameter gradients are those
of one pass whose dropout draws per micro-batch (docs/training.md, "Gradient caching").

Each view (a, b, and the flattened hard negatives) is cut into micro-batches of its own and
replayed one tower call at a time, so the activations alive at once are those of one tower on
one micro-batch (not of both views of ``k`` pairs); between replays only the cached ``(B, D)``
embedding gradients are held. Micro-batches of texts (token inputs) are cut from the view's
texts sorted by length (longest first, ties in row order): ``k`` of them at a time, or, with a
token budget, packed so that a micro-batch's padded size, rows x its longest text, stays within
``N`` tokens (at most ``k`` rows when both are set). Padding is then only among texts of similar
length, since a micro-batch's forward pass trims to its own longest text (pycode at B = 256,
view a: 22,944 padded tokens in consecutive micro-batches of 32, 5,890 sorted and packed).
Other inputs (vectors, images) are cut into ``k`` consecutive rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

import numpy as np
import torch
from torch import Tensor

from crl.errors import CrlValueError
from crl.models import DualEncoder
from crl.train.step import (
    PRECISIONS,
    Learner,
    StepLoss,
    _first_tensor,
    _loss_dtype,
    batch_loss,
    batch_to,
    global_value,
    tree_map,
)

Rows = slice | Tensor  # consecutive rows, or the (b,) indices of a length-sorted micro-batch


class CachedStep:
    """Each learner's gradients by gradient caching (module docstring), under its own RNG
    context.

    Args:
        micro_batch_size: At most this many texts of a view embedded at once (``k``; a pair's
            ``H`` hard negatives count ``H``). None: only the token budget.
        precision: ``fp32`` or ``bf16``: the towers' autocast, chosen here once.
        micro_batch_tokens: At most this many padded tokens per micro-batch (``N``), texts
            sorted by length first. None: ``k`` texts at a time (sorted by length too; other
            inputs: ``k`` consecutive rows).
    """

    def __init__(self, micro_batch_size: int | None, precision: str = "fp32",
                 micro_batch_tokens: int | None = None) -> None:
        if micro_batch_size is None and micro_batch_tokens is None:
            raise CrlValueError("CachedStep: give micro_batch_size or micro_batch_tokens; got "
                                "neither")
        self.micro_batch_size = micro_batch_size
        self.micro_batch_tokens = micro_batch_tokens
        self.autocast = PRECISIONS[precision]

    def __call__(self, learners: Sequence[Learner], batch: Any) -> list[StepLoss]:
        """See :class:`crl.train.step.Step`."""
        out = []
        for run in learners:
            with run.rng:
                inputs, index, labels = batch_to(batch, run.device)
                out.append(cached_backward(
                    run.model, run.objective, inputs, index, labels,
                    micro_batch_size=self.micro_batch_size, precision=self.autocast(run.device),
                    device=run.device, step=run.step, micro_batch_tokens=self.micro_batch_tokens))
        return out


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[Tensor, Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


@dataclass
class _View:
    """One tower's share of a batch: its inputs (``n`` rows), the tower, and its micro-batches.

    ``order`` is None for consecutive micro-batches, else the rows in the order the
    micro-batches take them (their embeddings are put back in row order)."""

    name: str
    encode: Callable[[Any], Tensor]
    x: Any
    chunks: list[Rows]
    order: Tensor | None


def is_token_form(x: Any) -> bool:
    """Whether ``x`` is in crl's token form ``(n, 2, L)``: integer ids and attention mask
    (:class:`crl.models.TransformerTokenizer`)."""
    return (isinstance(x, Tensor) and x.dim() == 3 and x.shape[1] == 2
            and not x.dtype.is_floating_point)


def token_lengths(x: Any, view: str) -> Tensor:
    """The ``(n,)`` token counts of a view's inputs, crl's token form ``(n, 2, L)`` (ids and
    attention mask, :class:`crl.models.TransformerTokenizer`).

    Raises:
        CrlValueError: if ``x`` is not in that form (the model does not take tokens).
    """
    if not is_token_form(x):
        got = (f"a {x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, Tensor)
               else type(x).__name__)
        raise CrlValueError(
            f"train.micro_batch_tokens: needs token inputs (n, 2, L) of ids and attention mask "
            f"(model.kind: transformer); view {view}'s inputs are {got}; use "
            "train.micro_batch_size instead")
    lengths: Tensor = x[:, 1].sum(dim=1)
    return lengths


def length_order(lengths: Tensor) -> Tensor:
    """The ``(n,)`` rows sorted by ``lengths``, longest first, ties in row order.

    Example:
        >>> length_order(torch.tensor([3, 9, 4, 9])).tolist()
        [1, 3, 2, 0]
    """
    return torch.sort(lengths, descending=True, stable=True).indices


#: What a micro-batch costs beyond its padded tokens (a tower call's fixed work), in tokens.
CHUNK_COST_TOKENS = 128


def pack_by_tokens(lengths: Tensor, max_tokens: int,
                   max_rows: int | None = None) -> tuple[Tensor, list[Tensor]]:
    """Rows sorted by length (longest first, ties in row order), cut into micro-batches of at
    most ``max_tokens`` padded tokens (rows x the micro-batch's longest text) and ``max_rows``
    rows; a text longer than the budget is a micro-batch of its own.

    The cuts minimise the padded tokens plus :data:`CHUNK_COST_TOKENS` per micro-batch (a
    dynamic programme over the sorted lengths): filling each micro-batch greedily would give
    the longest text's width to as many shorter texts as fit. The per-call cost keeps a
    handful of texts of similar length together rather than one micro-batch each.

    Returns:
        The ``(n,)`` order and the micro-batches' row indices, which cover it in order.

    Example:
        >>> order, chunks = pack_by_tokens(torch.tensor([3, 9, 4, 2, 8]), 16)
        >>> order.tolist(), [c.tolist() for c in chunks]
        ([1, 4, 2, 0, 3], [[1], [4], [2, 0, 3]])
    """
    order = length_order(lengths)
    n = int(order.numel())
    width = lengths[order].clamp(min=1).to(torch.float64).numpy()  # (n,) descending
    cap = n if max_rows is None else max_rows
    cost = np.full(n + 1, np.inf)  # cost[i]: the best cuts of the first i sorted rows
    cost[0] = 0.0
    start = np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        first = np.arange(max(0, end - cap), end)  # candidate first rows of the last chunk
        size = end - first
        fits = (size * width[first] <= max_tokens) | (size == 1)
        total = np.where(fits, cost[first] + size * width[first] + CHUNK_COST_TOKENS, np.inf)
        best = int(np.argmin(total))
        cost[end], start[end] = total[best], first[best]
    sizes: list[int] = []
    end = n
    while end > 0:
        sizes.append(end - int(start[end]))
        end = int(start[end])
    return order, list(torch.split(order, sizes[::-1]))


def _chunks(x: Any, name: str, rows_per_pair: int, micro_batch_size: int | None,
            micro_batch_tokens: int | None) -> tuple[list[Rows], Tensor | None]:
    n = int(_first_tensor(x).shape[0])
    cap = None if micro_batch_size is None else micro_batch_size * rows_per_pair
    if micro_batch_tokens is None:
        assert cap is not None  # CachedStep requires one of the two
        if is_token_form(x) and n > cap:  # k texts of similar length at a time: less padding
            order = length_order(token_lengths(x, name))
            return list(torch.split(order, cap)), order
        return [slice(s, min(s + cap, n)) for s in range(0, n, cap)], None
    order, chunks = pack_by_tokens(token_lengths(x, name), micro_batch_tokens, cap)
    return list(chunks), order


def _views(model: DualEncoder, inputs: tuple[Any, Any, Any], micro_batch_size: int | None,
           micro_batch_tokens: int | None) -> list[_View]:
    xa, xb, xh = inputs
    listed: list[tuple[str, Callable[[Any], Tensor], Any, int]] = [
        ("a", model.encode_a, xa, 1), ("b", model.encode_b, xb, 1)]
    if xh is not None:  # (B, H, ...) -> (B H, ...): H texts per pair
        hard = int(_first_tensor(xh).shape[1])
        listed.append(("h", model.encode_b, tree_map(lambda t: t.flatten(0, 1), xh), hard))
    out = []
    for name, encode, x, per_pair in listed:
        chunks, order = _chunks(x, name, per_pair, micro_batch_size, micro_batch_tokens)
        out.append(_View(name, encode, x, chunks, order))
    return out


def _take(x: Any, rows: Rows) -> Any:
    """The rows ``rows`` of every input tensor (a micro-batch)."""
    return tree_map(lambda t: t[rows], x)


def _first_pass(views: list[_View], precision: AbstractContextManager[Any],
                device: torch.device) -> tuple[list[Tensor], list[list[Any]]]:
    """Every view's embeddings without the graph, in row order, and the RNG state before each
    of its micro-batches. Micro-batches of the views alternate (a, b, h, a, b, h, ...): with
    consecutive rows this draws the masks of embedding each micro-batch's pairs together."""
    parts: list[list[Tensor]] = [[] for _ in views]
    states: list[list[Any]] = [[] for _ in views]
    with torch.no_grad(), precision:
        for round_ in zip_longest(*(view.chunks for view in views)):
            for v, rows in enumerate(round_):
                if rows is not None:
                    states[v].append(_rng_state(device))
                    parts[v].append(_loss_dtype(views[v].encode(_take(views[v].x, rows))))
    out = []
    for view, part in zip(views, parts, strict=True):
        z = torch.cat(part)  # (n, D), micro-batch order
        if view.order is not None:  # back to row order
            z = torch.empty_like(z).index_copy_(0, view.order, z)
        out.append(z)
    return out, states


def cached_backward(model: DualEncoder, objective: torch.nn.Module, inputs: tuple[Any, Any, Any],
                    index: Tensor, labels: Tensor, *, micro_batch_size: int | None,
                    precision: AbstractContextManager[Any], device: torch.device, step: int,
                    micro_batch_tokens: int | None = None) -> StepLoss:
    """Gradient caching (module docstring) of one batch, ``inputs = (xa, xb, xh)`` on
    ``device``: the loss, with the gradients left in ``.grad``."""
    views = _views(model, inputs, micro_batch_size, micro_batch_tokens)
    embedded, states = _first_pass(views, precision, device)
    after = _rng_state(device)
    leaves = [z.requires_grad_(True) for z in embedded]
    size = int(index.shape[0])
    za, zb = leaves[0], leaves[1]
    zh = leaves[2].reshape(size, -1, za.shape[-1]) if len(leaves) > 2 else None  # (B, H, D)
    loss, logs = batch_loss(objective, model, (za, zb, zh), index, labels)
    value = global_value(loss, step)
    # the loss's own parameters, and the embeddings' gradients: the only (B, D) state kept
    loss.backward()  # type: ignore[no-untyped-call]
    del loss, za, zb, zh
    grads = [leaf.grad for leaf in leaves]
    del leaves, embedded
    for view, grad, view_states in zip(views, grads, states, strict=True):  # pass 2: replay
        if grad is None:  # the loss does not use this view
            continue
        for rows, state in zip(view.chunks, view_states, strict=True):
            _set_rng_state(state, device)
            with precision:
                again = _loss_dtype(view.encode(_take(view.x, rows)))
            if again.requires_grad:
                again.backward(grad[rows])  # type: ignore[no-untyped-call]  # frees its graph
            del again
    _set_rng_state(after, device)  # as after one pass over the batch
    return value, logs


__all__ = ["CachedStep", "cached_backward", "pack_by_tokens", "token_lengths"]
