"""Pairs sampled from the closed-form models of docs/theory.md §2 (:mod:`crl.theory`).

The pool of ``num_samples`` pairs is drawn once from a generator seeded by the split seed, so every
run with the same data config sees the same pairs, and :func:`synthetic_model` returns the very
model they came from, whose population quantities (``L*``, ``E*``, ``s*``) are exact.

The latent-class model is finite: its items are encoded as one-hot vectors of dimension
``C * items_per_class`` (so a bilinear score on them is any score table), labelled by class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from crl.data.config import SyntheticConfig

if TYPE_CHECKING:
    from crl.theory.models import ExactModel


def synthetic_model(cfg: SyntheticConfig) -> ExactModel:
    """The :mod:`crl.theory` model ``cfg`` describes.

    Example:
        >>> synthetic_model(SyntheticConfig(a=1.0, sigma=1.0)).optimal_risk(1.0)
        -1.0
    """
    from crl.theory.gaussian import CorrelatedGaussian, GaussianMeanShift
    from crl.theory.latent import LatentClassModel

    if cfg.model == "gaussian_mean_shift":
        return GaussianMeanShift(cfg.a, cfg.sigma, dim=cfg.dim)
    if cfg.model == "correlated_gaussian":
        return CorrelatedGaussian(cfg.rho, dim=cfg.dim)
    return LatentClassModel(cfg.class_probs, items_per_class=cfg.items_per_class)


def sample_synthetic(cfg: SyntheticConfig, seed: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """The pool of ``cfg.num_samples`` pairs ``x (N, d)``, ``y (N, d)`` (float32) and, for the
    latent-class model, the class of each anchor ``(N,)``.

    Example:
        >>> x, y, labels = sample_synthetic(SyntheticConfig(num_samples=8), seed=0)
        >>> x.shape, y.dtype, labels is None
        (torch.Size([8, 2]), torch.float32, True)
        >>> cfg = SyntheticConfig(model="latent_classes", class_probs=[0.5, 0.5], items_per_class=3)
        >>> x, y, labels = sample_synthetic(cfg, seed=0)
        >>> x.shape, x.sum(dim=1).unique().tolist(), sorted(labels.unique().tolist())
        (torch.Size([4096, 6]), [1.0], [0, 1])
    """
    from crl.theory.latent import LatentClassModel

    model = synthetic_model(cfg)
    generator = torch.Generator().manual_seed(seed)
    x, y = model.sample(cfg.num_samples, generator)
    if not isinstance(model, LatentClassModel):
        return x.float(), y.float(), None
    num_items = len(model.item_class)
    item_class = torch.as_tensor(model.item_class, dtype=torch.long)
    eye = torch.eye(num_items)
    return eye[x], eye[y], item_class[x]
