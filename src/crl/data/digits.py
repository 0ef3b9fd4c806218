"""scikit-learn's bundled handwritten digits (1,797 8x8 images, 10 classes) as two-view pairs."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from crl.data.augment import augment_image, augment_images, item_seed
from crl.data.base import Item, PairDataset
from crl.data.config import DigitsConfig


def load_digit_images() -> tuple[Tensor, Tensor]:
    """All 1,797 digits: images ``(N, 1, 8, 8)`` float32 in [0, 1] and labels ``(N,)`` int64.

    Example:
        >>> images, labels = load_digit_images()
        >>> images.shape, float(images.max()), int(labels.max())
        (torch.Size([1797, 1, 8, 8]), 1.0, 9)
    """
    images, labels = _digits_arrays()
    return torch.tensor(images)[:, None], torch.tensor(labels)


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return (np.asarray(bunch.images, dtype=np.float32) / 16.0,
            np.asarray(bunch.target, dtype=np.int64))


#: Seeds the augmented evaluation views (the same for every run and training seed).
EVAL_VIEW_SEED = 0x5EED_E7A1


class AugmentedImageDataset(PairDataset):
    """Two independently augmented views of each image (SimCLR-style positives).

    View ``v`` (0 or 1) of item ``i`` at epoch ``e`` is drawn with a generator seeded by
    ``(seed, e, i, v)``: the same on any worker, different across epochs.

    Example:
        >>> images, labels = torch.rand(4, 1, 8, 8), torch.arange(4)
        >>> ds = AugmentedImageDataset(images, labels, DigitsConfig(), seed=0)
        >>> a, b, index, label = ds[2]
        >>> a.shape, bool((a != b).any()), index, label
        (torch.Size([1, 8, 8]), True, 2, 2)
    """

    def __init__(self, images: Tensor, labels: Tensor | None, cfg: DigitsConfig,
                 seed: int) -> None:
        super().__init__(labels)
        self.images = images
        self.cfg = cfg
        self.seed = seed
        self._eval_b: Tensor | None = None

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def view(self, i: int, view: int) -> Tensor:
        """View ``view`` (0 or 1) of item ``i`` at the current epoch, shape ``(C, H, W)``."""
        if not self.cfg.augment:
            return self.images[i].clone()
        generator = torch.Generator().manual_seed(item_seed(self.seed, self.epoch, i, view))
        return augment_image(self.images[i], self.cfg, generator)

    def _views(self, i: int) -> tuple[Tensor, Tensor]:
        return self.view(i, 0), self.view(i, 1)

    def __getitems__(self, indices: Sequence[int]) -> list[Item]:
        """The items ``indices`` at once (torch's DataLoader calls this for a whole batch): the
        views equal those of ``self[i]``, resampled in one batched call."""
        idx = [int(i) for i in indices]
        if not self.cfg.augment:
            return [self[i] for i in idx]
        images = self.images[torch.as_tensor(idx, dtype=torch.long)]  # (B, C, H, W)
        views = [augment_images(images, self.cfg, [
            torch.Generator().manual_seed(item_seed(self.seed, self.epoch, i, v)) for i in idx])
            for v in (0, 1)]
        labels = self.labels
        return [(views[0][k], views[1][k], i, int(labels[i]) if labels is not None else -1)
                for k, i in enumerate(idx)]

    def eval_views(self) -> tuple[Tensor, Tensor]:
        """The clean images, and one augmented view of each drawn with a fixed seed.

        The seed depends on neither the training seed nor the epoch, so every run is evaluated on
        the same pairs and retrieval means "find the augmented copy of this image" (with the
        clean image twice, recall would be trivially 1).
        """
        if not self.cfg.augment:
            return self.images, self.images
        if self._eval_b is None:
            self._eval_b = torch.stack([
                augment_image(self.images[i], self.cfg,
                              torch.Generator().manual_seed(item_seed(EVAL_VIEW_SEED, i)))
                for i in range(len(self))])
        return self.images, self._eval_b

    def subset(self, indices: Sequence[int] | np.ndarray) -> AugmentedImageDataset:
        idx = np.asarray(indices, dtype=np.int64)
        t = torch.as_tensor(idx, dtype=torch.long)
        return AugmentedImageDataset(self.images[t], self._subset_labels(idx), self.cfg, self.seed)
