"""What a step is made of: embed a batch, call the objective once, back-propagate, update.

A batch from the DataLoader is ``(xa, xb, index, labels)`` or ``(xa, xb, index, labels, xh)``
with ``xh`` the ``H`` hard negatives of each pair in view-b input form, ``(B, H, ...)``. Their
embeddings ``(B, H, D)`` go to the objective as ``hard=``.

A :class:`Step` strategy (:mod:`crl.train.steps`: one pass, gradient caching, a group of runs)
puts the loss's gradients into ``.grad`` of each :class:`Learner`'s parameters, built from these
small functions; the trainer then calls :func:`apply_gradients` once per run.

Under torchrun the embeddings are gathered over ranks before the loss (:func:`batch_loss`), and
the objective scores this rank's rows (docs/distributed.md). ``train.precision: bf16`` runs the
towers under bfloat16 autocast and hands their bfloat16 embeddings to the objective: a loss that
runs tiled multiplies them in bfloat16 in the exact kernel, every other path widens them to
float32 first; accumulations, the loss and the logit scale stay float32 (docs/training.md).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from crl import distributed
from crl.errors import CrlError, CrlValueError
from crl.losses import Objective
from crl.models import DualEncoder
from crl.train.lazy_adamw import coalesced, step_together

PRECISIONS: dict[str, Callable[[torch.device], AbstractContextManager[Any]]] = {
    "fp32": lambda device: contextlib.nullcontext(),
    "bf16": lambda device: torch.autocast(device.type, dtype=torch.bfloat16),
}

Embeddings = tuple[Tensor, Tensor, Tensor | None]  # za (B, D), zb (B, D), zh (B, H, D) | None
#: A step's result for one run: the global batch's loss and the objective's logs.
StepLoss = tuple[float, dict[str, float]]


class Learner(Protocol):
    """What a step strategy trains: one run's model and objective, where they run, the number
    of steps taken, and the context under which the run draws random numbers (its own stream
    in a group; nothing for a lone run)."""

    @property
    def model(self) -> DualEncoder: ...

    @property
    def objective(self) -> Objective: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def step(self) -> int: ...

    @property
    def rng(self) -> AbstractContextManager[Any]: ...


class Step(Protocol):
    """A step strategy, chosen once when the trainer is built: the loss's gradients of every
    learner on one batch, accumulated into ``.grad`` (zeroed by the caller)."""

    def __call__(self, learners: Sequence[Learner], batch: Any) -> list[StepLoss]:
        """Each learner's loss (averaged over ranks) and logs, in order.

        Raises:
            NonFiniteLossError: when a loss is not finite (before its backward pass).
        """
        ...


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


def global_value(loss: Tensor, step: int) -> float:
    """The global batch's loss (the ranks' shares averaged); raises if it is not finite."""
    value = float(distributed.all_reduce_sum(loss.detach().reshape(1))) / distributed.world_size()
    if not math.isfinite(value):
        raise NonFiniteLossError(f"the training loss is {value} at step {step + 1}")
    return value


def split_batch(batch: Any) -> tuple[Any, Any, Tensor, Tensor, Any | None]:
    """``(xa, xb, index, labels, xh or None)`` of a 4- or 5-tuple batch (module docstring)."""
    if not isinstance(batch, (tuple, list)) or len(batch) not in (4, 5):
        raise CrlValueError("train_step: a batch must be (xa, xb, index, labels) or (xa, xb, "
                            f"index, labels, hard_negatives); got {type(batch).__name__} of "
                            f"length {len(batch) if isinstance(batch, (tuple, list)) else '?'}")
    xa, xb, index, labels = batch[:4]
    return xa, xb, index, labels, (batch[4] if len(batch) == 5 else None)


def batch_to(batch: Any, device: torch.device) -> tuple[tuple[Any, Any, Any], Tensor, Tensor]:
    """``((xa, xb, xh), index, labels)`` of a batch (:func:`split_batch`) on ``device``."""
    xa, xb, index, labels, xh = split_batch(batch)
    inputs: tuple[Any, Any, Any] = tree_map(lambda t: t.to(device), (xa, xb, xh))
    return inputs, index.to(device), labels.to(device)


def clip_gradients(params: Sequence[Tensor], max_norm: float) -> Tensor:
    """The global norm of the gradients of ``params``, which are scaled in place by
    ``min(1, max_norm / (norm + 1e-6))`` (:func:`torch.nn.utils.clip_grad_norm_`).

    A sparse gradient (an embedding table of a ``model.sparse`` bag) is coalesced first, in
    ``.grad``: its repeated rows summed, its values are the nonzero rows of the dense gradient,
    so the norm and the clipped gradient are the dense model's (up to the order of the sums;
    docs/training.md, section "Sparse embedding gradients"). Without sparse gradients this is
    ``clip_grad_norm_`` itself.
    """
    sparse = [p for p in params if p.grad is not None and p.grad.is_sparse]
    if not sparse:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    for p in sparse:
        p.grad = coalesced(cast(Tensor, p.grad))
    grads = [p.grad.values() if p.grad.is_sparse else p.grad for p in params
             if p.grad is not None]  # a coalesced tensor's values() is its storage
    norm = torch.nn.utils.get_total_norm(grads)
    if math.isfinite(max_norm):
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale)
    return norm


def clip_gradients_together(param_lists: Sequence[Sequence[Tensor]],
                            max_norms: Sequence[float]) -> list[Tensor]:
    """:func:`clip_gradients` of several runs' parameters (a group's, ``param_lists[g]`` with
    ``max_norms[g]``): every tensor's norm in one ``torch._foreach_norm`` call, then each run's
    global norm and scale. Each run's norm and clipped gradients are what
    :func:`clip_gradients` gives it alone, bit for bit: ``clip_grad_norm_`` too takes one
    ``_foreach_norm`` of a run's gradients (per tensor, so a longer list changes no value)
    and the norm of their stack. Runs whose gradients span devices or dtypes are clipped one
    by one.

    Returns:
        Each run's global gradient norm, a 0-dim tensor.
    """
    grads_of: list[list[Tensor]] = []
    for params in param_lists:
        for p in params:
            if p.grad is not None and p.grad.is_sparse:
                p.grad = coalesced(p.grad)
        grads_of.append([p.grad.values() if p.grad.is_sparse else p.grad for p in params
                         if p.grad is not None])
    flat = [g for grads in grads_of for g in grads]
    if not flat or len({(g.device, g.dtype) for g in flat}) != 1 or any(not g for g in grads_of):
        return [clip_gradients(params, max_norm)
                for params, max_norm in zip(param_lists, max_norms, strict=True)]
    per_tensor = list(torch._foreach_norm(flat, 2.0))
    norms = []
    start = 0
    for grads, max_norm in zip(grads_of, max_norms, strict=True):
        norm = torch.linalg.vector_norm(torch.stack(per_tensor[start:start + len(grads)]), 2.0)
        start += len(grads)
        if math.isfinite(max_norm):  # clip_grad_norm_'s scale (min(1, max / (norm + 1e-6)))
            torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        norms.append(norm)
    return norms


def apply_gradients(objective: Objective, optimizer: Optimizer, scheduler: LambdaLR,
                    logs: dict[str, float], *, grad_clip: float | None,
                    step: int) -> dict[str, float]:
    """The update after a :class:`Step` on the gradients in ``.grad``: averaged over ranks,
    clipped, the optimiser and scheduler stepped, the logit scale clamped; returns ``logs`` with
    ``train/lr`` and ``train/grad_norm``.

    Raises:
        NonFiniteLossError: before any parameter changes, when the gradients are not finite.
    """
    return apply_gradients_together([GradientUpdate(objective, optimizer, scheduler, logs,
                                                    grad_clip, step)])[0]


@dataclass(frozen=True)
class GradientUpdate:
    """One run's part of :func:`apply_gradients_together` (the arguments of
    :func:`apply_gradients`)."""

    objective: Objective
    optimizer: Optimizer
    scheduler: LambdaLR
    logs: dict[str, float]
    grad_clip: float | None
    step: int


def apply_gradients_together(updates: Sequence[GradientUpdate]) -> list[dict[str, float]]:
    """:func:`apply_gradients` of several runs (a group's): each run's gradients averaged,
    clipped and checked, then every optimiser stepped by
    :func:`~crl.train.lazy_adamw.step_together` (the runs' dense AdamW updates in one call,
    each value its own run's bit for bit), then each run's scheduler and logit-scale clamp.

    Raises:
        NonFiniteLossError: before any parameter of any run changes, when a run's gradients
            are not finite.
    """
    param_lists = [[p for group in u.optimizer.param_groups for p in group["params"]]
                   for u in updates]
    for params in param_lists:
        distributed.average_gradients(params)
    norms = clip_gradients_together(
        param_lists, [u.grad_clip if u.grad_clip is not None else math.inf for u in updates])
    values = torch.stack(norms).tolist()  # one read of every run's norm
    for u, value in zip(updates, values, strict=True):
        if not math.isfinite(value):
            raise NonFiniteLossError(f"the gradient norm is {value} at step {u.step + 1}")
    for u in updates:
        u.logs["train/lr"] = float(u.optimizer.param_groups[0]["lr"])  # the rate of this step
    step_together([u.optimizer for u in updates])
    for u, value in zip(updates, values, strict=True):
        u.scheduler.step()
        u.objective.after_step()  # clamps the logit scale / learnable temperatures
        u.logs["train/grad_norm"] = value
    return [u.logs for u in updates]


__all__ = [
    "PRECISIONS",
    "Embeddings",
    "GradientUpdate",
    "Learner",
    "NonFiniteLossError",
    "Step",
    "StepLoss",
    "apply_gradients",
    "apply_gradients_together",
    "batch_loss",
    "batch_to",
    "clip_gradients",
    "clip_gradients_together",
    "embed",
    "global_value",
    "split_batch",
    "tree_map",
]
