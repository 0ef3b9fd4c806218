"""The step strategies a :class:`~crl.train.Trainer` is given, each in its own module: one pass
(:mod:`.single`), gradient caching (:mod:`.cached`) and a group of runs on shared towers
(:mod:`.group`, :mod:`.towers`). :func:`build_step` picks a lone run's strategy, once.

A new way to get a step's gradients (a batched group step, micro-batches cut by a token budget)
is one more class with the :class:`~crl.train.step.Step` call and one more line here; the loop
does not change. :func:`loss_and_gradients` and :func:`train_step` are the same steps for a bare
model and objective, outside a trainer.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from crl.losses import Objective
from crl.models import DualEncoder
from crl.train.step import Step, StepLoss, apply_gradients
from crl.train.steps.cached import CachedStep
from crl.train.steps.group import GroupingError, GroupStep
from crl.train.steps.single import SingleStep
from crl.train.steps.towers import SeparateTowers, StackedTowers


def build_step(micro_batch_size: int | None = None, precision: str = "fp32",
               micro_batch_tokens: int | None = None) -> Step:
    """The step strategy of a lone run's ``train.micro_batch_size``,
    ``train.micro_batch_tokens`` and ``train.precision``.

    Args:
        micro_batch_size: Gradient caching with micro-batches of this size (None: one pass,
            unless ``micro_batch_tokens`` is given).
        precision: ``fp32`` or ``bf16`` (the towers' autocast).
        micro_batch_tokens: Gradient caching with micro-batches of at most this many tokens,
            texts sorted by length (:mod:`.cached`).

    Example:
        >>> type(build_step()).__name__, type(build_step(8, "bf16")).__name__
        ('SingleStep', 'CachedStep')
    """
    if micro_batch_size is not None or micro_batch_tokens is not None:
        return CachedStep(micro_batch_size, precision, micro_batch_tokens)
    return SingleStep(precision)


@dataclass
class _Alone:
    """A bare model and objective as a :class:`~crl.train.step.Learner` (no RNG of its own)."""

    model: DualEncoder
    objective: Objective
    device: torch.device
    step: int = 0
    rng: AbstractContextManager[Any] = field(default_factory=contextlib.nullcontext)


def loss_and_gradients(model: DualEncoder, objective: Objective, batch: Any, *,
                       device: torch.device, step: int = 0, micro_batch_size: int | None = None,
                       precision: str = "fp32", micro_batch_tokens: int | None = None) -> StepLoss:
    """The batch's loss (averaged over ranks), with the gradients accumulated into ``.grad`` of
    the model's and the objective's parameters (call ``zero_grad`` first).

    Args:
        model: The dual encoder (``encode_a``, ``encode_b``).
        objective: The training objective.
        batch: ``(xa, xb, index, labels[, xh])`` (:mod:`crl.train.step`).
        device: Where the model runs.
        step: The step (0-based), for error messages.
        micro_batch_size: Gradient caching with micro-batches of this size (None: one pass).
        precision: ``fp32`` or ``bf16`` (the towers' autocast).
        micro_batch_tokens: Gradient caching with micro-batches of at most this many tokens.

    Raises:
        NonFiniteLossError: when the loss is not finite (before any backward pass).
    """
    strategy = build_step(micro_batch_size, precision, micro_batch_tokens)
    [out] = strategy([_Alone(model, objective, device, step)], batch)
    return out


def train_step(model: DualEncoder, objective: Objective, batch: Any, optimizer: Optimizer,
               scheduler: LambdaLR, *, grad_clip: float | None, step: int, device: torch.device,
               micro_batch_size: int | None = None, precision: str = "fp32",
               micro_batch_tokens: int | None = None) -> StepLoss:
    """One optimiser step on a batch: :func:`loss_and_gradients`, then
    :func:`~crl.train.step.apply_gradients` (averaged over ranks, clipped, the optimiser and
    scheduler stepped, the logit scale clamped).

    Returns:
        The global batch's loss and the step's logs (with ``train/lr`` and ``train/grad_norm``).

    Raises:
        NonFiniteLossError: before any parameter changes, when the loss or the gradients are
            not finite.
    """
    optimizer.zero_grad(set_to_none=True)
    value, logs = loss_and_gradients(model, objective, batch, device=device, step=step,
                                     micro_batch_size=micro_batch_size, precision=precision,
                                     micro_batch_tokens=micro_batch_tokens)
    return value, apply_gradients(objective, optimizer, scheduler, logs, grad_clip=grad_clip,
                                  step=step)


__all__ = [
    "CachedStep",
    "GroupStep",
    "GroupingError",
    "SeparateTowers",
    "SingleStep",
    "StackedTowers",
    "build_step",
    "loss_and_gradients",
    "train_step",
]
