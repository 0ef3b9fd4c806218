"""Encoder towers: linear, MLP, a small CNN for 8x8 images, and projection heads.

No tower uses batch statistics (no BatchNorm), so a row's output never depends on the other rows
of its batch: the same sample gives the same embedding in any batch split or process.
"""

from __future__ import annotations

from torch import Tensor, nn

from crl.errors import CrlValueError


def mlp(in_dim: int, hidden_dim: int, out_dim: int, num_layers: int) -> nn.Sequential:
    """``num_layers`` hidden blocks ``Linear -> LayerNorm -> GELU``, then ``Linear`` to ``out_dim``.

    Example:
        >>> import torch
        >>> mlp(3, 8, 2, num_layers=2)(torch.zeros(5, 3)).shape
        torch.Size([5, 2])
    """
    layers: list[nn.Module] = []
    width = in_dim
    for _ in range(num_layers):
        layers += [nn.Linear(width, hidden_dim), nn.LayerNorm(hidden_dim), nn.GELU()]
        width = hidden_dim
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


class ResidualLinear(nn.Module):
    """``x + W x + b`` with ``W`` and ``b`` initialised at zero: a head that starts as the
    identity, so training begins exactly at the backbone's (e.g. frozen MiniLM's) similarities.

    Example:
        >>> import torch
        >>> x = torch.randn(2, 4)
        >>> torch.equal(ResidualLinear(4)(x), x)
        True
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.linear(x)
        return out


def projection_head(kind: str, in_dim: int, hidden_dim: int, out_dim: int,
                    num_layers: int = 1) -> nn.Module:
    """A projection head: ``none`` (identity), ``linear``, ``mlp`` (``num_layers`` hidden) or
    ``residual`` (:class:`ResidualLinear`, needs ``out_dim == in_dim``)."""
    if kind == "none":
        return nn.Identity()
    if kind == "linear":
        return nn.Linear(in_dim, out_dim)
    if kind == "residual":
        if out_dim != in_dim:
            raise CrlValueError(f"projection_head: a 'residual' head keeps the dimension; set "
                             f"embed_dim={in_dim} (got {out_dim})")
        return ResidualLinear(in_dim)
    return mlp(in_dim, hidden_dim, out_dim, num_layers)


class SmallCNN(nn.Module):
    """Convolutions for small images ``(B, C, H, W) -> (B, out_dim)``.

    Each width in ``channels`` adds a 3x3 convolution and GELU; every layer after the first
    halves the resolution (stride 2). The last feature map is flattened (8x8 digits keep their
    layout: a 4x4 map with two layers) and mapped linearly to ``out_dim``.

    Example:
        >>> import torch
        >>> SmallCNN((1, 8, 8), [16, 32], 64)(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 64])
    """

    def __init__(self, image_shape: tuple[int, ...], channels: list[int], out_dim: int) -> None:
        super().__init__()
        in_channels, height, width = image_shape
        layers: list[nn.Module] = []
        for i, c in enumerate(channels):
            stride = 1 if i == 0 else 2
            layers += [nn.Conv2d(in_channels, c, 3, stride=stride, padding=1), nn.GELU()]
            in_channels = c
            height, width = (height - 1) // stride + 1, (width - 1) // stride + 1
        self.features = nn.Sequential(*layers)
        self.out = nn.Linear(in_channels * height * width, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        h = self.features(x)  # (B, C', H', W')
        out: Tensor = self.out(h.flatten(1))  # (B, out_dim)
        return out


class Tower(nn.Module):
    """A backbone (the representation used by probes) followed by a projection head."""

    def __init__(self, backbone: nn.Module, head: nn.Module | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head if head is not None else nn.Identity()

    def represent(self, x: Tensor) -> Tensor:
        """The backbone's output ``(B, R)``, before the projection head."""
        out: Tensor = self.backbone(x)
        return out

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.head(self.backbone(x))
        return out
