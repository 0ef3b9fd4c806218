"""The relaxed (spectral) k-means regulariser (Zha et al. 2001; docs/theory.md §8), as
functions."""

from __future__ import annotations

import torch
from torch import Tensor

from crl._validation import check_int_range, check_tensor, compute_dtype, upcast


def relaxed_kmeans(z: Tensor, k: int) -> Tensor:
    """Sum of all but the ``k`` largest eigenvalues of ``z @ z.T``.

    ``L_RKM(Z) = tr(Z^T Z) - max_{P^T P = I_k} tr(P^T Z Z^T P)``, a lower bound on the k-means cost
    of the rows of ``Z`` with ``k`` clusters. Computed from the smaller of the ``(B, B)`` and
    ``(D, D)`` Gram matrices, which share their non-zero eigenvalues.

    Args:
        z: ``(B, D)`` embeddings.
        k: Number of clusters, ``1 <= k <= D``.

    Returns:
        0-dim tensor (non-negative up to rounding).

    Example:
        >>> z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> float(relaxed_kmeans(z, 1))  # eigenvalues 4 and 1: drop the largest
        1.0
    """
    where = "relaxed_kmeans"
    z = check_tensor(where, "z", z, ndim=2)
    check_int_range(where, "k", k, 1, z.shape[1])
    return relaxed_kmeans_unchecked(z, k)


def relaxed_kmeans_unchecked(z: Tensor, k: int) -> Tensor:
    """:func:`relaxed_kmeans` without input checks (the trainer's embeddings)."""
    z = upcast(z, compute_dtype(z))
    gram = z.T @ z if z.shape[1] <= z.shape[0] else z @ z.T  # (min(B, D), min(B, D))
    eigenvalues: Tensor = torch.linalg.eigvalsh(gram)  # ascending
    keep = max(eigenvalues.shape[0] - k, 0)
    return eigenvalues[:keep].sum()


__all__ = ["relaxed_kmeans", "relaxed_kmeans_unchecked"]
