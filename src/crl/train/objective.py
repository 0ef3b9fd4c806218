"""The trainer's objective: :class:`crl.losses.TrainingObjective`, built once from the run's
``loss`` and ``negatives`` sections by :func:`crl.losses.build_objective`."""

from crl.losses.training import TrainingObjective as Objective
from crl.losses.training import build_objective

__all__ = ["Objective", "build_objective"]
