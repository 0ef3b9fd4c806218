"""Pairs sampled from the closed-form models of THEORY.md section 5.

The pool of ``num_samples`` pairs is drawn once from a generator seeded by the split seed, so every
run with the same data config sees the same pairs; the population quantities (``L*``, ``E*``,
``s*``) are those of :mod:`crl.theory`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from crl.data.config import SyntheticConfig


def sample_gaussian_mean_shift(n: int, dim: int, a: float, sigma: float,
                               generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``x ~ N(0, I)``, ``y ~ N(a x, sigma^2 I)``; returns ``x (n, dim)``, ``y (n, dim)``."""
    x = torch.randn(n, dim, generator=generator, dtype=torch.float64)
    y = a * x + sigma * torch.randn(n, dim, generator=generator, dtype=torch.float64)
    return x, y


def sample_correlated_gaussian(n: int, dim: int, rho: float,
                               generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``x ~ N(0, I)``, ``y | x ~ N(rho x, (1 - rho^2) I)``; returns ``(n, dim)`` twice."""
    x = torch.randn(n, dim, generator=generator, dtype=torch.float64)
    noise = torch.randn(n, dim, generator=generator, dtype=torch.float64)
    return x, rho * x + (1.0 - rho**2) ** 0.5 * noise


def sample_latent_classes(n: int, dim: int, class_probs: list[float], separation: float,
                          generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Disjoint latent classes: ``c ~ pi``; ``x``, ``y`` i.i.d. from ``D_c = N(separation e_c, I)``.

    Positives are drawn from the whole class (internal discrepancy 0, THEORY.md section 7).

    Returns:
        ``x (n, dim)``, ``y (n, dim)`` and the classes ``c (n,)``.
    """
    probs = torch.tensor(class_probs, dtype=torch.float64)
    c = torch.multinomial(probs / probs.sum(), n, replacement=True, generator=generator)
    centres = separation * torch.eye(len(class_probs), dim, dtype=torch.float64)  # (C, dim)
    x = centres[c] + torch.randn(n, dim, generator=generator, dtype=torch.float64)
    y = centres[c] + torch.randn(n, dim, generator=generator, dtype=torch.float64)
    return x, y, c


def sample_synthetic(cfg: SyntheticConfig, seed: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """The pool of ``cfg.num_samples`` pairs (float32) and labels (latent classes only).

    Example:
        >>> x, y, labels = sample_synthetic(SyntheticConfig(num_samples=8), seed=0)
        >>> x.shape, y.dtype, labels is None
        (torch.Size([8, 2]), torch.float32, True)
    """
    generator = torch.Generator().manual_seed(seed)
    labels: Tensor | None = None
    if cfg.model == "gaussian_mean_shift":
        x, y = sample_gaussian_mean_shift(cfg.num_samples, cfg.dim, cfg.a, cfg.sigma, generator)
    elif cfg.model == "correlated_gaussian":
        x, y = sample_correlated_gaussian(cfg.num_samples, cfg.dim, cfg.rho, generator)
    else:
        x, y, labels = sample_latent_classes(cfg.num_samples, cfg.dim, cfg.class_probs,
                                             cfg.separation, generator)
    return x.float(), y.float(), labels
