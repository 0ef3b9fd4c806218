"""The gradient-cached step (``train.micro_batch_size: k``, as GradCache and
sentence-transformers' ``CachedMultipleNegativesRankingLoss``).

The towers embed micro-batches of ``k`` without the graph; the loss and its gradient with respect
to the embeddings are computed on the full batch; then each micro-batch is embedded again with
the graph, replaying the RNG state of its first pass (dropout draws the same masks), and
back-propagates its rows of the cached gradient. The loss and the parameter gradients are those
of one pass whose dropout draws per micro-batch; activation memory is that of ``k`` pairs
(docs/training.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from crl.models import DualEncoder
from crl.train.step import (
    PRECISIONS,
    Embeddings,
    Learner,
    StepLoss,
    batch_loss,
    batch_to,
    embed,
    global_value,
    tree_map,
)


class CachedStep:
    """Each learner's gradients by gradient caching (module docstring), under its own RNG
    context.

    Args:
        micro_batch_size: Pairs embedded at once (``k``).
        precision: ``fp32`` or ``bf16``: the towers' autocast, chosen here once.
    """

    def __init__(self, micro_batch_size: int, precision: str = "fp32") -> None:
        self.micro_batch_size = micro_batch_size
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
                    device=run.device, step=run.step))
        return out


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[Tensor, Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _take(inputs: tuple[Any, Any, Any], rows: slice) -> tuple[Any, Any, Any]:
    """The rows ``rows`` of every input tensor (a micro-batch)."""
    out: tuple[Any, Any, Any] = tree_map(lambda t: t[rows], inputs)
    return out


def cached_backward(model: DualEncoder, objective: nn.Module, inputs: tuple[Any, Any, Any],
                    index: Tensor, labels: Tensor, *, micro_batch_size: int,
                    precision: AbstractContextManager[Any], device: torch.device,
                    step: int) -> StepLoss:
    """Gradient caching (module docstring) of one batch, ``inputs = (xa, xb, xh)`` on
    ``device``: the loss, with the gradients left in ``.grad``."""
    size = int(index.shape[0])
    chunks = [slice(s, min(s + micro_batch_size, size)) for s in range(0, size, micro_batch_size)]
    states, parts = [], []
    with torch.no_grad():
        for rows in chunks:  # pass 1: embeddings only, remembering each chunk's RNG state
            states.append(_rng_state(device))
            parts.append(embed(model, *_take(inputs, rows), precision))
    after = _rng_state(device)
    za = torch.cat([part[0] for part in parts]).requires_grad_(True)
    zb = torch.cat([part[1] for part in parts]).requires_grad_(True)
    zh = None
    if parts[0][2] is not None:
        zh = torch.cat([part[2] for part in parts if part[2] is not None]).requires_grad_(True)
    z: Embeddings = (za, zb, zh)
    loss, logs = batch_loss(objective, model, z, index, labels)
    value = global_value(loss, step)
    # the loss's own parameters, and the embeddings' gradients
    loss.backward()  # type: ignore[no-untyped-call]
    for rows, state in zip(chunks, states, strict=True):  # pass 2: replay, back-propagate
        _set_rng_state(state, device)
        again = embed(model, *_take(inputs, rows), precision)
        pairs = [(out, leaf.grad[rows]) for out, leaf in zip(again, z, strict=True)
                 if out is not None and leaf is not None and leaf.grad is not None]
        if pairs:
            torch.autograd.backward([p[0] for p in pairs],  # type: ignore[no-untyped-call]
                                    [p[1] for p in pairs])
    _set_rng_state(after, device)  # as after one pass over the batch
    return value, logs


__all__ = ["CachedStep", "cached_backward"]
