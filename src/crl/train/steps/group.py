"""The group step: runs that differ only in their negatives (:func:`crl.train.fit_group`), one
batch for all of them.

The runs' towers embed the batch once for the group (:mod:`crl.train.steps.towers`: stacked, or
each run's on its own); each run's objective scores its own embeddings under the run's RNG
stream; one backward pass of the summed losses. A run's parameters receive only its own loss's
gradient, so every run takes the steps it would take alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from crl.errors import CrlError
from crl.train.step import Learner, StepLoss, batch_loss, batch_to, global_value


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


class GroupStep:
    """Every learner's gradients on the same batch (module docstring).

    Args:
        towers: How the runs' towers embed the batch
            (:class:`~crl.train.steps.towers.StackedTowers` or
            :class:`~crl.train.steps.towers.SeparateTowers`).
    """

    def __init__(self, towers: Towers) -> None:
        self.towers = towers

    def __call__(self, learners: Sequence[Learner], batch: Any) -> list[StepLoss]:
        """See :class:`crl.train.step.Step`.

        Raises:
            GroupingError: for a batch with hard negatives.
        """
        (xa, xb, xh), index, labels = batch_to(batch, learners[0].device)
        if xh is not None:
            raise GroupingError("grouped training: the batch has hard negatives")
        stacked_a, stacked_b = self.towers(learners, xa, xb)
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


def _per_run(z: GroupEmbeddings) -> Sequence[Tensor]:
    """Run ``g``'s ``(B, D)`` embeddings at ``[g]``."""
    return z.unbind(0) if isinstance(z, Tensor) else z


__all__ = ["GroupEmbeddings", "GroupStep", "GroupingError", "Towers"]
