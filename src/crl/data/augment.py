"""Random image augmentations in plain torch, deterministic per (seed, epoch, index, view).

Each view of each item gets its own ``torch.Generator`` seeded from a hash of the four integers,
so the same config produces the same views on any number of data-loader workers or processes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def _draw(cfg: DigitsConfig, generator: torch.Generator, shape: tuple[int, int, int]
          ) -> tuple[list[float], Tensor | None, tuple[int, int] | None]:
    """The random choices of one view: affine ``[cos, -sin, tx, sin, cos, ty]``, the noise
    ``(C, H, W)`` (None without noise) and the cutout corner (None without cutout)."""
    _, h, w = shape
    u = torch.rand(5, generator=generator, dtype=torch.float64).tolist()
    low, high = cfg.crop_scale
    scale = low + (high - low) * u[0]
    angle = math.radians(cfg.max_rotation * (2 * u[1] - 1))
    # Normalised coordinates span 2 units per side, so a shift of f sides is 2 f units.
    tx, ty = (2 * cfg.max_shift * (2 * v - 1) for v in u[2:4])
    cos, sin = scale * math.cos(angle), scale * math.sin(angle)
    noise = (torch.randn(shape, generator=generator, dtype=torch.float32)
             if cfg.noise_std > 0 else None)
    corner = None
    if u[4] < cfg.cutout_prob:
        size = min(cfg.cutout_size, h, w)
        top = int(torch.randint(0, h - size + 1, (), generator=generator))
        left = int(torch.randint(0, w - size + 1, (), generator=generator))
        corner = (top, left)
    return [cos, -sin, tx, sin, cos, ty], noise, corner


def augment_images(images: Tensor, cfg: DigitsConfig, generators: Sequence[torch.Generator]
                   ) -> Tensor:
    """One random view of each of ``images (B, C, H, W)``, the ``i``-th drawn from
    ``generators[i]``; every view is the same as :func:`augment_image` gives for its image.

    The random choices are drawn per view; the resampling runs once for the whole batch.

    Example:
        >>> gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
        >>> augment_images(torch.rand(2, 1, 8, 8), DigitsConfig(), gens).shape
        torch.Size([2, 1, 8, 8])
    """
    b, c, h, w = images.shape
    draws = [_draw(cfg, g, (c, h, w)) for g in generators]
    theta = torch.tensor([d[0] for d in draws], dtype=images.dtype).view(b, 2, 3)
    grid = F.affine_grid(theta, [b, c, h, w], align_corners=False)  # (B, H, W, 2)
    out = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros",
                        align_corners=False)  # (B, C, H, W)
    if cfg.noise_std > 0:
        noise = torch.stack([d[1] for d in draws if d[1] is not None]).to(out.dtype)
        out = (out + cfg.noise_std * noise).clamp_(0.0, 1.0)
    size = min(cfg.cutout_size, h, w)
    for k, (_, _, corner) in enumerate(draws):
        if corner is not None:
            out[k, :, corner[0]:corner[0] + size, corner[1]:corner[1] + size] = 0.0
    return out


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
    return augment_images(image[None], cfg, [generator])[0]
