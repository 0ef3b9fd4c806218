"""The group step: runs that differ only in their negatives (:func:`crl.train.fit_group`), one
batch for all of them.

The runs' towers embed the batch once for the group (:mod:`crl.train.steps.towers`: stacked, or
each run's on its own); each run's objective scores its own embeddings under the run's RNG
stream, or the group's losses are computed in one go (:mod:`crl.losses.gcl_group`, for GCL);
one backward pass of the summed losses. A run's parameters receive only its own loss's
gradient, so every run takes the steps it would take alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import Tensor

from crl.errors import CrlError
from crl.models.bag_rows import shared_bag_rows
from crl.train.checkpoint import rng_state, same_rng_state
from crl.train.step import (
    GradientUpdate,
    Learner,
    StepLoss,
    apply_gradients_together,
    batch_loss,
    batch_to,
    global_value,
)


class GroupingError(CrlError):
    """The runs cannot be trained as a group (train them one at a time)."""


#: The group's embeddings of one view: ``(G, B, D)``, or ``G`` tensors ``(B, D)``.
GroupEmbeddings = Tensor | list[Tensor]


class Towers(Protocol):
    """The towers of a group's runs on one batch."""

    def __call__(self, learners: Sequence[Learner], xa: Any, xb: Any
                 ) -> tuple[GroupEmbeddings, GroupEmbeddings]:
        """``za[g], zb[g]`` of shape ``(B, D)``: run ``g``'s float32 embeddings of the batch."""
        ...


class GroupLosses(Protocol):
    """The losses of a group's runs in one computation
    (:class:`~crl.losses.gcl_group.GroupedGcl`)."""

    def __call__(self, za: Tensor, zb: Tensor, index: Tensor, labels: Tensor | None
                 ) -> list[tuple[Tensor, dict[str, float]]]:
        """Run ``g``'s loss and logs from its embeddings ``za[g], zb[g]`` of shape ``(B, D)``,
        as its own objective gives them."""
        ...


class GroupStep:
    """Every learner's gradients on the same batch (module docstring).

    Args:
        towers: How the runs' towers embed the batch
            (:class:`~crl.train.steps.towers.StackedTowers` or
            :class:`~crl.train.steps.towers.SeparateTowers`).
        losses: The runs' losses in one computation (chosen once, by
            :func:`crl.losses.gcl_group.grouped_gcl`), or None: each run's objective on its own,
            under the run's RNG stream.
    """

    def __init__(self, towers: Towers, losses: GroupLosses | None = None) -> None:
        self.towers = towers
        self.losses = losses

    def __call__(self, learners: Sequence[Learner], batch: Any) -> list[StepLoss]:
        """See :class:`crl.train.step.Step`.

        Raises:
            GroupingError: for a batch with hard negatives.
        """
        (xa, xb, xh), index, labels = batch_to(batch, learners[0].device)
        if xh is not None:
            raise GroupingError("grouped training: the batch has hard negatives")
        stacked_a, stacked_b = self.towers(learners, xa, xb)
        if self.losses is not None:  # draws no random numbers: no run's stream is needed
            group = self.losses(_stacked(stacked_a), _stacked(stacked_b), index, labels)
            out = [(global_value(loss, run.step), logs)
                   for run, (loss, logs) in zip(learners, group, strict=True)]
            torch.stack([loss for loss, _ in group]).sum().backward()  # type: ignore[no-untyped-call]
            return out
        # One view per run: unbind's backward stacks the runs' gradients once, where indexing
        # ``za[g]`` would add a zero-padded (G, B, D) gradient per run (G^2 B D of work).
        za, zb = _per_run(stacked_a), _per_run(stacked_b)
        losses, out = [], []
        for g, run in enumerate(learners):
            with run.rng:
                loss, logs = batch_loss(run.objective, run.model, (za[g], zb[g], None), index,
                                        labels)
                out.append((global_value(loss, run.step), logs))
            losses.append(loss)
        torch.stack(losses).sum().backward()  # type: ignore[no-untyped-call]
        return out


class _Updated(Protocol):
    def gradient_update(self, logs: dict[str, float]) -> GradientUpdate: ...

    def record_update(self, loss: float, logs: dict[str, float]) -> None: ...


def update_group(runs: Sequence[_Updated], losses: Sequence[StepLoss]) -> None:
    """Every run's optimiser step, together (:func:`~crl.train.step.apply_gradients_together`:
    the runs' dense AdamW updates in one call, each run's values its own bit for bit), outside
    the runs' RNG streams: an update draws no random numbers (checked once per step on the
    global torch, numpy and python streams), and setting a run's stream costs more than a small
    model's update.

    Raises:
        GroupingError: when an update drew (the runs then train one at a time).
    """
    before = rng_state()
    updated = apply_gradients_together([run.gradient_update(logs)
                                        for run, (_, logs) in zip(runs, losses, strict=True)])
    for run, (loss, _), logs in zip(runs, losses, updated, strict=True):
        run.record_update(loss, logs)
    if not same_rng_state(before, rng_state()):
        raise GroupingError("grouped training: an optimiser step drew random numbers")


def shared_inputs(runs: Sequence[object]) -> AbstractContextManager[None]:
    """Around a group's evaluations of the same batches: an embedding bag's rows of a batch
    found once for all runs (:func:`~crl.models.bag_rows.shared_bag_rows`); nothing for one."""
    return shared_bag_rows() if len(runs) > 1 else contextlib.nullcontext()


def _stacked(z: GroupEmbeddings) -> Tensor:
    """The runs' ``(G, B, D)`` embeddings."""
    return z if isinstance(z, Tensor) else torch.stack(z)


def _per_run(z: GroupEmbeddings) -> Sequence[Tensor]:
    """Run ``g``'s ``(B, D)`` embeddings at ``[g]``."""
    return z.unbind(0) if isinstance(z, Tensor) else z


__all__ = ["GroupEmbeddings", "GroupLosses", "GroupStep", "GroupingError", "Towers",
           "shared_inputs", "update_group"]
