"""The tensors many tests build: a batch of paired embeddings and a float64 leaf for gradient
checks, written once (``tests/conftest.py`` puts this folder on ``sys.path`` and also offers
them as the fixtures ``make_pair`` and ``make_leaf``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def make_pair(batch: int, dim: int, *, seed: int = 0, noise: float | None = None,
              normalize: bool = False, dtype: torch.dtype = torch.float64,
              requires_grad: bool = False) -> tuple[Tensor, Tensor]:
    """Embeddings ``(a, b)`` of shape ``(batch, dim)``: ``b[i]`` is the positive of ``a[i]``.

    Both come from one generator seeded with ``seed``, drawn in float64 and then cast to
    ``dtype`` (so a float32 pair equals the float64 one up to rounding).

    Args:
        batch, dim: The shape ``(B, D)``.
        seed: The generator's seed.
        noise: None: ``b`` is independent of ``a``; ``s``: ``b = a + s * N(0, I)``, a positive
            correlated with its anchor, as after some training.
        normalize: L2-normalise the rows: ``a`` first, then ``b`` (after adding the noise to the
            normalised ``a``).
        dtype: The returned dtype.
        requires_grad: Return leaves that require gradients.
    """
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(batch, dim, generator=gen, dtype=torch.float64)
    other = torch.randn(batch, dim, generator=gen, dtype=torch.float64)
    if normalize:
        a = F.normalize(a, dim=1)
    b = other if noise is None else a + noise * other
    if normalize:
        b = F.normalize(b, dim=1)
    a, b = a.to(dtype), b.to(dtype)
    return (a.requires_grad_(True), b.requires_grad_(True)) if requires_grad else (a, b)


def make_leaf(*shape: int, seed: int, scale: float = 1.0) -> Tensor:
    """A float64 ``N(0, scale^2)`` tensor of ``shape`` that requires gradients (gradcheck)."""
    gen = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(*shape, generator=gen, dtype=torch.float64)
    return x.requires_grad_(True)
