"""The one-pass step: the towers on the whole batch with the autograd graph, the objective once,
one backward pass (nanoGPT's step; :mod:`crl.train.step` holds the pieces)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crl.train.step import PRECISIONS, Learner, StepLoss, batch_loss, batch_to, embed, global_value


class SingleStep:
    """Each learner's gradients from one pass over the batch (``train.micro_batch_size``
    unset), under its own RNG context.

    Args:
        precision: ``fp32`` or ``bf16``: the towers' autocast (:data:`~crl.train.step.PRECISIONS`),
            chosen here once.
    """

    def __init__(self, precision: str = "fp32") -> None:
        self.autocast = PRECISIONS[precision]

    def __call__(self, learners: Sequence[Learner], batch: Any) -> list[StepLoss]:
        """See :class:`crl.train.step.Step`."""
        out = []
        for run in learners:
            with run.rng:
                (xa, xb, xh), index, labels = batch_to(batch, run.device)
                z = embed(run.model, xa, xb, xh, self.autocast(run.device))
                loss, logs = batch_loss(run.objective, run.model, z, index, labels)
                value = global_value(loss, run.step)
                loss.backward()  # type: ignore[no-untyped-call]
            out.append((value, logs))
        return out


__all__ = ["SingleStep"]
