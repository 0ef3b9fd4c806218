"""Thin ``nn.Module`` wrappers: they hold hyperparameters and learnable state, then call the
pure functions of :mod:`crl.losses`."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from crl._validation import check_positive
from crl.losses.infonce import clip_loss, info_nce
from crl.losses.siglip import siglip_loss
from crl.losses.supcon import supcon_loss

#: CLIP's initial logit scale, ``log(1 / 0.07)``.
CLIP_INIT_LOGIT_SCALE = math.log(1 / 0.07)
#: CLIP clamps the logit scale so that ``exp(logit_scale) <= 100``.
CLIP_MAX_LOGIT_SCALE = math.log(100.0)


class InfoNCELoss(nn.Module):
    """:func:`~crl.losses.info_nce` with a fixed temperature.

    Example:
        >>> loss = InfoNCELoss(temperature=1.0)
        >>> round(float(loss(torch.eye(3), torch.eye(3))), 4)
        0.5514
    """

    def __init__(self, temperature: float = 0.07, symmetric: bool = False) -> None:
        super().__init__()
        check_positive("InfoNCELoss", "temperature", temperature, allow_tensor=False)
        self.temperature = float(temperature)
        self.symmetric = bool(symmetric)

    def forward(self, a: Tensor, b: Tensor, negatives_mask: Tensor | None = None) -> Tensor:
        return info_nce(a, b, temperature=self.temperature, symmetric=self.symmetric,
                        negatives_mask=negatives_mask)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, symmetric={self.symmetric}"


class ClipLoss(nn.Module):
    """The CLIP loss with a learnable ``logit_scale`` (``scale = exp(logit_scale)``).

    ``logit_scale`` starts at ``log(1/0.07)`` and is clamped to ``[0, log 100]`` at every forward
    pass, as CLIP does after each step, so ``1 <= exp(logit_scale) <= 100`` always holds.

    Example:
        >>> loss = ClipLoss()
        >>> round(float(loss.logit_scale.detach().exp()), 4)
        14.2857
    """

    def __init__(self, init_logit_scale: float = CLIP_INIT_LOGIT_SCALE,
                 max_logit_scale: float = CLIP_MAX_LOGIT_SCALE, learnable: bool = True) -> None:
        super().__init__()
        self.max_logit_scale = float(max_logit_scale)
        value = torch.tensor(min(float(init_logit_scale), self.max_logit_scale))
        self.logit_scale = nn.Parameter(value, requires_grad=learnable)

    def clamp_(self) -> None:
        """Clamp ``logit_scale`` in place to ``[0, max_logit_scale]``."""
        with torch.no_grad():
            self.logit_scale.clamp_(0.0, self.max_logit_scale)

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        self.clamp_()
        return clip_loss(a, b, self.logit_scale.exp())


class SigLipLoss(nn.Module):
    """The SigLIP loss with learnable ``logit_scale`` (init ``log 10``) and ``logit_bias``
    (init -10), as in Zhai et al. 2023.

    Example:
        >>> loss = SigLipLoss()
        >>> round(float(loss.logit_scale.detach().exp()), 4), float(loss.logit_bias.detach())
        (10.0, -10.0)
    """

    def __init__(self, init_logit_scale: float = math.log(10.0), init_logit_bias: float = -10.0,
                 max_logit_scale: float = CLIP_MAX_LOGIT_SCALE) -> None:
        super().__init__()
        self.max_logit_scale = float(max_logit_scale)
        self.logit_scale = nn.Parameter(torch.tensor(float(init_logit_scale)))
        self.logit_bias = nn.Parameter(torch.tensor(float(init_logit_bias)))

    def clamp_(self) -> None:
        """Clamp ``logit_scale`` in place to at most ``max_logit_scale``."""
        with torch.no_grad():
            self.logit_scale.clamp_(max=self.max_logit_scale)

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        self.clamp_()
        return siglip_loss(a, b, self.logit_scale.exp(), self.logit_bias)


class SupConLoss(nn.Module):
    """:func:`~crl.losses.supcon_loss` with a fixed temperature.

    Example:
        >>> z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
        >>> round(float(SupConLoss(temperature=1.0)(z, torch.tensor([0, 0, 1, 1]))), 4)
        0.5514
    """

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        check_positive("SupConLoss", "temperature", temperature, allow_tensor=False)
        self.temperature = float(temperature)

    def forward(self, z: Tensor, labels: Tensor) -> Tensor:
        return supcon_loss(z, labels, temperature=self.temperature)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"
