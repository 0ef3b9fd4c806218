"""Digits: pixel range, augmentations deterministic per (seed, epoch, index), identity cases."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from crl.data import DataConfig, DigitsConfig, load_data
from crl.data.augment import augment_image, item_seed
from crl.data.digits import AugmentedImageDataset, load_digit_images

_NONE = {"crop_scale": (1.0, 1.0), "max_shift": 0.0, "max_rotation": 0.0, "noise_std": 0.0,
         "cutout_prob": 0.0}


def _small(seed: int = 0, **overrides: object) -> AugmentedImageDataset:
    images, labels = load_digit_images()
    return AugmentedImageDataset(images[:16], labels[:16], DigitsConfig(**overrides), seed)


def test_images_are_scaled_to_unit_range() -> None:
    images, labels = load_digit_images()
    assert images.shape == (1797, 1, 8, 8) and images.dtype == torch.float32
    assert float(images.min()) == 0.0 and float(images.max()) == 1.0
    assert torch.bincount(labels).min() >= 170


def test_views_deterministic_per_seed_epoch_index() -> None:
    ds, again = _small(), _small()
    a1, b1, i1, l1 = ds[3]
    a2, b2, _, _ = again[3]
    assert torch.equal(a1, a2) and torch.equal(b1, b2)
    assert (i1, l1) == (3, int(load_digit_images()[1][3]))
    assert not torch.equal(a1, b1)  # two different views
    assert not torch.equal(ds[3][0], ds[4][0])
    ds.set_epoch(1)
    assert not torch.equal(ds[3][0], a1)  # new epoch, new views
    ds.set_epoch(0)
    assert torch.equal(ds[3][0], a1)
    assert not torch.equal(_small(seed=1)[3][0], a1)  # the seed matters
    for view in (a1, b1):
        assert view.shape == (1, 8, 8) and float(view.min()) >= 0 and float(view.max()) <= 1


def test_views_identical_with_two_workers() -> None:
    ds = _small()
    ds.set_epoch(2)
    direct = torch.stack([ds[i][0] for i in range(len(ds))])
    loader = DataLoader(ds, batch_size=5, num_workers=2, shuffle=False)
    batches = list(loader)
    assert torch.equal(torch.cat([b[0] for b in batches]), direct)
    assert torch.cat([b[2] for b in batches]).tolist() == list(range(16))


def test_no_augmentation_settings_give_the_image_back() -> None:
    image = torch.rand(1, 8, 8)
    out = augment_image(image, DigitsConfig(**_NONE), torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, image, atol=1e-6, rtol=0)
    plain = _small(augment=False)
    assert torch.equal(plain[5][0], plain.images[5]) and torch.equal(plain[5][1], plain.images[5])


def test_cutout_zeroes_one_square() -> None:
    cfg = DigitsConfig(**{**_NONE, "cutout_prob": 1.0, "cutout_size": 3})
    for seed in range(5):
        out = augment_image(torch.ones(1, 8, 8), cfg, torch.Generator().manual_seed(seed))
        zero = (out == 0).nonzero()
        assert len(zero) == 9
        assert int(zero[:, 1].max() - zero[:, 1].min()) == 2
        assert int(zero[:, 2].max() - zero[:, 2].min()) == 2


def test_noise_has_the_configured_scale() -> None:
    cfg = DigitsConfig(**{**_NONE, "noise_std": 0.05})
    image = torch.full((1, 64, 64), 0.5)
    out = augment_image(image, cfg, torch.Generator().manual_seed(0))
    diff = out - image
    assert abs(float(diff.mean())) < 0.005
    assert abs(float(diff.std()) - 0.05) < 0.005


def test_shift_moves_the_mass_and_rotation_keeps_the_centre() -> None:
    image = torch.zeros(1, 8, 8)
    image[0, 3:5, 3:5] = 1.0
    rotated = augment_image(image, DigitsConfig(**{**_NONE, "max_rotation": 30.0}),
                            torch.Generator().manual_seed(0))
    rows = torch.arange(8.0)[:, None]
    centre = float((rotated[0] * rows).sum() / rotated[0].sum())
    assert abs(centre - 3.5) < 1e-4  # a rotation about the centre keeps the blob's centre


def test_item_seed_stable_and_distinct() -> None:
    seeds = {item_seed(0, e, i, v) for e in range(3) for i in range(50) for v in range(2)}
    assert len(seeds) == 300
    assert item_seed(7, 1, 2, 0) == item_seed(7, 1, 2, 0)
    assert 0 <= item_seed(2**40, -1, 3) < 2**63


def test_load_digits_eval_views_and_stratification() -> None:
    splits = load_data(DataConfig(name="digits", val_fraction=0.1, test_fraction=0.2))
    a, b = splits.test.eval_views()
    assert a.shape == b.shape == (len(splits.test), 1, 8, 8)
    assert torch.equal(a, splits.test.images) and not torch.equal(a, b)  # clean vs augmented
    other = load_data(DataConfig(name="digits", seed=5, val_fraction=0.1, test_fraction=0.2))
    assert torch.equal(other.test.eval_views()[1], b)  # same pairs whatever the training seed
    assert splits.info.kind == "image" and splits.info.image_shape == (1, 8, 8)
    assert len(splits.train) + len(splits.val) + len(splits.test) == 1797
    counts = torch.bincount(splits.test.labels)
    assert int(counts.max() - counts.min()) <= 2


def test_batched_items_equal_single_items() -> None:
    """The DataLoader's batched fetch (``__getitems__``) gives exactly the per-item views."""
    splits = load_data(DataConfig(name="digits", seed=3))
    train = splits.train
    train.set_epoch(2)
    indices = [5, 0, 17, 5 + len(train) // 2, 3]
    batched = train.__getitems__(indices)
    for k, i in enumerate(indices):
        single = train[i]
        assert torch.equal(batched[k][0], single[0]) and torch.equal(batched[k][1], single[1])
        assert batched[k][2:] == single[2:]
