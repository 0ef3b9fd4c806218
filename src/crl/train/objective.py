"""The trainer's objective: :class:`crl.losses.TrainingObjective` (``Objective`` here), built once
from the run's ``loss`` and ``negatives`` sections by :func:`crl.losses.build_objective` (through
:func:`crl.train.build.build_objective`, which adds the ``model`` section's logit-scale
settings)."""

from crl.losses.training import TrainingObjective as Objective

__all__ = ["Objective"]
