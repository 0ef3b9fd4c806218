"""The relaxed k-means regulariser of a run's objective (Zha et al. 2001; docs/theory.md §8); the
math is :mod:`crl.losses.functional.kmeans`."""

from __future__ import annotations

from torch import Tensor

from crl.losses.functional.kmeans import relaxed_kmeans_unchecked


class RelaxedKMeans:
    """The relaxed k-means regulariser added to a training objective: ``weight`` times the
    mean of :func:`~crl.losses.relaxed_kmeans` of both views, with ``k`` clusters (at most ``D``).

    Computed on the whole batch by every rank, so the mean over ranks is unchanged.

    Example:
        >>> import torch
        >>> z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> value, logs = RelaxedKMeans(0.5, 1)(z, z)
        >>> float(value), logs
        (0.5, {'train/relaxed_kmeans': 1.0})
    """

    def __init__(self, weight: float, k: int) -> None:
        self.weight = float(weight)
        self.k = int(k)

    def __call__(self, za: Tensor, zb: Tensor) -> tuple[Tensor, dict[str, float]]:
        k = min(self.k, za.shape[1])
        regulariser = 0.5 * (relaxed_kmeans_unchecked(za, k) + relaxed_kmeans_unchecked(zb, k))
        return self.weight * regulariser, {"train/relaxed_kmeans": float(regulariser.detach())}


__all__ = ["RelaxedKMeans"]
