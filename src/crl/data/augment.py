"""Random image augmentations in plain torch, deterministic per (seed, epoch, index, view).

Each view of each item gets its own ``torch.Generator`` seeded from a hash of the four integers,
so the same config produces the same views on any number of data-loader workers or processes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from crl.data.config import DigitsConfig

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def item_seed(*keys: int) -> int:
    """A 63-bit seed mixed from integer ``keys`` (stable across processes, unlike ``hash``).

    Example:
        >>> item_seed(0, 1, 2) == item_seed(0, 1, 2), item_seed(0, 1, 2) == item_seed(0, 2, 1)
        (True, False)
    """
    h = 0
    for k in keys:
        h = _splitmix64(h ^ (k & _MASK64))
    return h >> 1


def _uniform(generator: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand((), generator=generator, dtype=torch.float64))


def augment_image(image: Tensor, cfg: DigitsConfig, generator: torch.Generator) -> Tensor:
    """One random view of ``image (C, H, W)`` with pixels in [0, 1].

    In order: a random affine map (zoom in by a factor in ``cfg.crop_scale``, a rotation of at
    most ``cfg.max_rotation`` degrees, a shift of at most ``cfg.max_shift`` of the side, bilinear
    resampling with zero padding), Gaussian noise of std ``cfg.noise_std`` clipped back to [0, 1],
    and with probability ``cfg.cutout_prob`` one zeroed ``cfg.cutout_size`` square.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> view = augment_image(torch.rand(1, 8, 8), DigitsConfig(), g)
        >>> view.shape, bool(view.min() >= 0), bool(view.max() <= 1)
        (torch.Size([1, 8, 8]), True, True)
    """
    c, h, w = image.shape
    scale = _uniform(generator, *cfg.crop_scale)
    angle = math.radians(_uniform(generator, -cfg.max_rotation, cfg.max_rotation))
    # Normalised coordinates span 2 units per side, so a shift of f sides is 2 f units.
    tx = _uniform(generator, -2 * cfg.max_shift, 2 * cfg.max_shift)
    ty = _uniform(generator, -2 * cfg.max_shift, 2 * cfg.max_shift)
    cos, sin = scale * math.cos(angle), scale * math.sin(angle)
    theta = torch.tensor([[[cos, -sin, tx], [sin, cos, ty]]], dtype=image.dtype)  # (1, 2, 3)
    grid = F.affine_grid(theta, [1, c, h, w], align_corners=False)  # (1, H, W, 2)
    out = F.grid_sample(image[None], grid, mode="bilinear", padding_mode="zeros",
                        align_corners=False)[0]  # (C, H, W)
    if cfg.noise_std > 0:
        noise = torch.randn(out.shape, generator=generator, dtype=out.dtype)
        out = (out + cfg.noise_std * noise).clamp_(0.0, 1.0)
    if float(torch.rand((), generator=generator)) < cfg.cutout_prob:
        size = min(cfg.cutout_size, h, w)
        top = int(torch.randint(0, h - size + 1, (), generator=generator))
        left = int(torch.randint(0, w - size + 1, (), generator=generator))
        out[:, top:top + size, left:left + size] = 0.0
    return out
