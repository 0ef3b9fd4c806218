"""One optimiser step: embed the batch, call the objective once, back-propagate, update.

A batch from the DataLoader is ``(xa, xb, index, labels)`` or ``(xa, xb, index, labels, xh)``
with ``xh`` the ``H`` hard negatives of each pair in view-b input form, ``(B, H, ...)``. Their
embeddings ``(B, H, D)`` go to the objective as ``hard=``.

Two ways to get the gradients, chosen by ``train.micro_batch_size``:

- one pass (None): the towers run on the whole batch with the autograd graph;
- gradient caching (``k``, as GradCache and sentence-transformers' ``CachedMultipleNegatives
  RankingLoss``): the towers embed micro-batches of ``k`` without the graph; the loss and its
  gradient with respect to the embeddings are computed on the full batch; then each micro-batch
  is embedded again with the graph, replaying the RNG state of its first pass (dropout draws the
  same masks), and back-propagates its rows of the cached gradient. The loss and the parameter
  gradients are those of one pass whose dropout draws per micro-batch; activation memory is that
  of ``k`` pairs (docs/training.md).

Under torchrun the embeddings are gathered over ranks before the loss in both ways, and the
objective scores this rank's rows (docs/distributed.md). ``train.precision: bf16`` runs the
towers under bfloat16 autocast and hands their bfloat16 embeddings to the objective: a loss that
runs tiled multiplies them in bfloat16 in the exact kernel, every other path widens them to
float32 first; accumulations, the loss and the logit scale stay float32 (docs/training.md).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from crl import distributed
from crl.errors import CrlError, CrlValueError
from crl.losses import Objective
from crl.models import DualEncoder

#: The towers' autocast context of each ``train.precision``.
PRECISIONS: dict[str, Callable[[torch.device], AbstractContextManager[Any]]] = {
    "fp32": lambda device: contextlib.nullcontext(),
    "bf16": lambda device: torch.autocast(device.type, dtype=torch.bfloat16),
}

Embeddings = tuple[Tensor, Tensor, Tensor | None]  # za (B, D), zb (B, D), zh (B, H, D) | None


class NonFiniteLossError(CrlError):
    """The training loss became NaN or Inf."""


def tree_map(fn: Callable[[Tensor], Tensor], x: Any) -> Any:
    """Apply ``fn`` to every tensor of a model input (a tensor, or tuples, lists and dicts of
    them, as a model's ``prepare`` defines its inputs).

    Example:
        >>> tree_map(lambda t: t * 2, {"ids": torch.ones(1), "n": 3})
        {'ids': tensor([2.]), 'n': 3}
    """
    if isinstance(x, Tensor):
        return fn(x)
    if isinstance(x, Mapping):
        return {key: tree_map(fn, value) for key, value in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(tree_map(fn, value) for value in x)
    return x


def _first_tensor(x: Any) -> Tensor:
    if isinstance(x, Tensor):
        return x
    values = x.values() if isinstance(x, Mapping) else x
    return next(_first_tensor(v) for v in values if isinstance(v, (Tensor, Mapping, tuple, list)))


def embed(model: DualEncoder, xa: Any, xb: Any, xh: Any | None,
          precision: AbstractContextManager[Any]) -> Embeddings:
    """The embeddings of a (micro-)batch, ``za, zb (b, D)`` and ``zh (b, H, D)``: bfloat16 as
    the towers give them under bf16 autocast (the objective widens them where it does not tile),
    float32 otherwise."""
    with precision:
        za, zb = model.encode_a(xa), model.encode_b(xb)
        zh = None
        if xh is not None:
            b, h = _first_tensor(xh).shape[:2]
            zh = model.encode_b(tree_map(lambda t: t.flatten(0, 1), xh)).reshape(b, h, -1)
    return _loss_dtype(za), _loss_dtype(zb), None if zh is None else _loss_dtype(zh)


def _loss_dtype(z: Tensor) -> Tensor:
    """``z`` as the objective takes it: bfloat16 kept, anything else float32."""
    return z if z.dtype == torch.bfloat16 else z.float()


def batch_loss(objective: nn.Module, model: DualEncoder, z: Embeddings, index: Tensor,
               labels: Tensor) -> tuple[Tensor, dict[str, float]]:
    """The objective on a batch's embeddings; under torchrun, this rank's share of the global
    batch's loss (the embeddings, indices and labels are gathered in rank order first)."""
    za, zb, zh = z
    rows = None
    if distributed.is_active():  # the global batch, in rank order (docs/distributed.md)
        za, zb = distributed.all_gather_with_grad(za), distributed.all_gather_with_grad(zb)
        zh = None if zh is None else distributed.all_gather_with_grad(zh)
        index, labels = distributed.all_gather_tensor(index), distributed.all_gather_tensor(labels)
        rows = distributed.own_rows(za.shape[0])  # this rank's anchors against all columns
    # The one call of the objective in the trainer (contract: crl.losses.build_objective).
    out: tuple[Tensor, dict[str, float]] = objective(za, zb, index, labels, rows=rows, hard=zh)
    return out


def _global_value(loss: Tensor, step: int) -> float:
    """The global batch's loss (the ranks' shares averaged); raises if it is not finite."""
    value = float(distributed.all_reduce_sum(loss.detach().reshape(1))) / distributed.world_size()
    if not math.isfinite(value):
        raise NonFiniteLossError(f"the training loss is {value} at step {step + 1}")
    return value


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


def _cached_backward(model: DualEncoder, objective: nn.Module, inputs: tuple[Any, Any, Any],
                     index: Tensor, labels: Tensor, *, micro_batch_size: int,
                     precision: AbstractContextManager[Any], device: torch.device,
                     step: int) -> tuple[float, dict[str, float]]:
    """Gradient caching (module docstring): the loss, and the gradients left in ``.grad``."""
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
    value = _global_value(loss, step)
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


def split_batch(batch: Any) -> tuple[Any, Any, Tensor, Tensor, Any | None]:
    """``(xa, xb, index, labels, xh or None)`` of a 4- or 5-tuple batch (module docstring)."""
    if not isinstance(batch, (tuple, list)) or len(batch) not in (4, 5):
        raise CrlValueError("train_step: a batch must be (xa, xb, index, labels) or (xa, xb, "
                            f"index, labels, hard_negatives); got {type(batch).__name__} of "
                            f"length {len(batch) if isinstance(batch, (tuple, list)) else '?'}")
    xa, xb, index, labels = batch[:4]
    return xa, xb, index, labels, (batch[4] if len(batch) == 5 else None)


def loss_and_gradients(model: DualEncoder, objective: nn.Module, batch: Any, *,
                       device: torch.device, step: int = 0, micro_batch_size: int | None = None,
                       precision: str = "fp32") -> tuple[float, dict[str, float]]:
    """The batch's loss (averaged over ranks), with the gradients accumulated into ``.grad`` of
    the model's and the objective's parameters (call ``zero_grad`` first).

    Args:
        model: The dual encoder (``encode_a``, ``encode_b``).
        objective: The training objective.
        batch: See the module docstring.
        device: Where the model runs.
        step: The step (0-based), for error messages.
        micro_batch_size: Gradient caching with micro-batches of this size (None: one pass).
        precision: ``fp32`` or ``bf16`` (the towers' autocast).

    Raises:
        NonFiniteLossError: when the loss is not finite (before any backward pass).
    """
    xa, xb, index, labels, xh = split_batch(batch)
    inputs = tree_map(lambda t: t.to(device), (xa, xb, xh))
    index, labels = index.to(device), labels.to(device)
    context = PRECISIONS[precision](device)
    if micro_batch_size is not None:
        return _cached_backward(model, objective, inputs, index, labels,
                                micro_batch_size=micro_batch_size, precision=context,
                                device=device, step=step)
    xa, xb, xh = inputs
    loss, logs = batch_loss(objective, model, embed(model, xa, xb, xh, context), index, labels)
    value = _global_value(loss, step)
    loss.backward()  # type: ignore[no-untyped-call]
    return value, logs


def train_step(model: DualEncoder, objective: Objective, batch: Any, optimizer: Optimizer,
               scheduler: LambdaLR, *, grad_clip: float | None, step: int, device: torch.device,
               micro_batch_size: int | None = None,
               precision: str = "fp32") -> tuple[float, dict[str, float]]:
    """One optimiser step on a batch: :func:`loss_and_gradients`, the gradients averaged over
    ranks and clipped, the optimiser and scheduler stepped, the logit scale clamped.

    Returns:
        The global batch's loss and the step's logs (with ``train/lr`` and ``train/grad_norm``).

    Raises:
        NonFiniteLossError: before any parameter changes, when the loss or the gradients are
            not finite.
    """
    optimizer.zero_grad(set_to_none=True)
    value, logs = loss_and_gradients(model, objective, batch, device=device, step=step,
                                     micro_batch_size=micro_batch_size, precision=precision)
    return value, apply_gradients(objective, optimizer, scheduler, logs, grad_clip=grad_clip,
                                  step=step)


def apply_gradients(objective: Objective, optimizer: Optimizer, scheduler: LambdaLR,
                    logs: dict[str, float], *, grad_clip: float | None,
                    step: int) -> dict[str, float]:
    """The second half of :func:`train_step` on the gradients in ``.grad``: averaged over
    ranks, clipped, the optimiser and scheduler stepped, the logit scale clamped; returns
    ``logs`` with ``train/lr`` and ``train/grad_norm``."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    distributed.average_gradients(params)
    max_norm = grad_clip if grad_clip is not None else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if not bool(torch.isfinite(norm)):
        raise NonFiniteLossError(f"the gradient norm is {float(norm)} at step {step + 1}")
    logs["train/lr"] = float(optimizer.param_groups[0]["lr"])  # the rate of this step
    optimizer.step()
    scheduler.step()
    objective.after_step()  # clamps the logit scale / learnable temperatures
    logs["train/grad_norm"] = float(norm)
    return logs


__all__ = [
    "PRECISIONS",
    "NonFiniteLossError",
    "apply_gradients",
    "batch_loss",
    "embed",
    "loss_and_gradients",
    "split_batch",
    "train_step",
]
