"""Synthetic pools: the crl.theory models' own samples, with labels for latent classes."""

from __future__ import annotations

import torch

from crl.data import DataConfig, SyntheticConfig, load_data, synthetic_model
from crl.data.synthetic import sample_synthetic
from crl.theory.gaussian import CorrelatedGaussian, GaussianMeanShift


def test_pool_is_the_theory_models_sample() -> None:
    cfg = SyntheticConfig(a=0.7, sigma=1.3, num_samples=64)
    x, y, labels = sample_synthetic(cfg, seed=5)
    rx, ry = GaussianMeanShift(0.7, 1.3).sample(64, torch.Generator().manual_seed(5))
    assert labels is None
    torch.testing.assert_close(x, rx.float())
    torch.testing.assert_close(y, ry.float())
    model = synthetic_model(SyntheticConfig(model="correlated_gaussian", rho=0.5, dim=3))
    assert isinstance(model, CorrelatedGaussian)


def test_gaussian_pool_statistics() -> None:
    cfg = SyntheticConfig(model="correlated_gaussian", rho=0.6, dim=3, num_samples=20000)
    x, y, _ = sample_synthetic(cfg, seed=0)
    corr = (x * y).mean(dim=0)  # E[x_k y_k] = rho
    assert torch.allclose(corr, torch.full((3,), 0.6), atol=0.03)
    assert torch.allclose(y.var(dim=0), torch.ones(3), atol=0.05)


def test_latent_classes_one_hot_same_class_pairs() -> None:
    cfg = SyntheticConfig(model="latent_classes", class_probs=[0.5, 0.3, 0.2],
                          items_per_class=2, num_samples=3000)
    x, y, labels = sample_synthetic(cfg, seed=1)
    assert x.shape == (3000, 6) and labels is not None
    item_x, item_y = x.argmax(dim=1), y.argmax(dim=1)
    assert torch.equal(item_x // 2, labels) and torch.equal(item_y // 2, labels)
    freq = torch.bincount(labels).float() / 3000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.03)
    splits = load_data(DataConfig(name="synthetic", synthetic=cfg.model_dump()))
    assert splits.info.num_classes == 3 and splits.train.labels is not None
    assert splits.train[0][3] == int(splits.train.labels[0])
