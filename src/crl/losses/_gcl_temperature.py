"""GCL's temperature, one strategy per ``temperature_mode``, chosen once (docs/theory.md §10).

A strategy registers the temperature on the loss (as ``temperature``: a buffer when fixed, a
parameter when learned), gives the ``tau`` of a batch's anchors, turns the ratio ``g_hat / u``
into the per-anchor surrogate, keeps a learned temperature in range and reports the temperature
the held-out risk uses. It holds no tensor itself (``.to()`` replaces buffers), only its
settings; the loss passes its ``temperature`` in.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from crl._validation import check_choice, check_positive, describe
from crl.errors import CrlTypeError, CrlValueError


class FixedTemperature:
    """``temperature_mode: fixed``: a float64 0-dim buffer ``tau``, the surrogate
    ``tau * g_hat / u``.

    Args:
        rho: The KL-radius term of the learned temperatures' objective (unused here).
        min_temperature: Lower clamp of learned temperatures (unused here).
    """

    mode: ClassVar[str] = "fixed"

    def __init__(self, rho: float, min_temperature: float) -> None:
        self.rho = float(rho)
        self.min_temperature = float(min_temperature)

    def attach(self, loss: nn.Module, temperature: float, num_samples: int) -> None:
        """Register ``loss.temperature`` (initially ``temperature``) on a loss of
        ``num_samples`` samples."""
        # float64 so that a float64 computation sees exactly the number that was given
        loss.register_buffer("temperature", torch.tensor(float(temperature), dtype=torch.float64))

    def of_batch(self, temperature: Tensor, direction: int, index: Tensor,
                 dtype: torch.dtype) -> Tensor:
        """``tau`` of direction ``direction`` (0: ``a -> b``) for the samples ``index (B,)``:
        0-dim, or ``(B,)`` per sample."""
        return temperature.to(device=index.device, dtype=dtype)

    def surrogate(self, tau: Tensor, ratio: Tensor, log_u: Tensor) -> Tensor:
        """``(A,)`` per-anchor surrogate from ``ratio = g_hat / u`` and ``log u`` (detached)."""
        return tau * ratio

    def clamp_(self, temperature: Tensor) -> None:
        """Keep a learned temperature in range (after an optimiser step)."""

    def clamp_if_below_(self, temperature: Tensor) -> None:
        """:meth:`clamp_` only where needed (before a call: an in-place write bumps the
        parameter's version)."""

    def risk_temperature(self, temperature: Tensor) -> float:
        """The temperature of the held-out contrastive risk."""
        return float(temperature)


class GlobalTemperature(FixedTemperature):
    """``temperature_mode: global_learnable``: a 0-dim parameter, the FastCLIP-v3 objective
    ``tau (log g + rho)`` per anchor (``tau * rho`` added), clamped to ``>= min_temperature``."""

    mode: ClassVar[str] = "global_learnable"

    def attach(self, loss: nn.Module, temperature: float, num_samples: int) -> None:
        if temperature < self.min_temperature:
            raise CrlValueError(f"{type(loss).__name__}: `temperature` must be >= "
                                f"min_temperature = {self.min_temperature} for a learnable "
                                f"temperature; got {temperature}")
        loss.temperature = nn.Parameter(self.initial(float(temperature), num_samples))

    def initial(self, temperature: float, num_samples: int) -> Tensor:
        """The parameter's first value."""
        return torch.tensor(temperature)

    def surrogate(self, tau: Tensor, ratio: Tensor, log_u: Tensor) -> Tensor:
        # Value tau (log u + rho); gradient tau grad(g_hat)/u (model) and
        # log u + tau g_hat'/u + rho (temperature), as FastCLIP-v3 / iSogCLR.
        return tau * (ratio - ratio.detach() + log_u + self.rho)

    def clamp_(self, temperature: Tensor) -> None:
        with torch.no_grad():
            temperature.clamp_(min=self.min_temperature)

    def clamp_if_below_(self, temperature: Tensor) -> None:
        with torch.no_grad():
            if bool((temperature < self.min_temperature).any()):
                self.clamp_(temperature)

    def risk_temperature(self, temperature: Tensor) -> float:
        return float(temperature.detach().mean())  # per-sample: their mean


class PerSampleTemperature(GlobalTemperature):
    """``temperature_mode: per_sample``: a ``(2, num_samples)`` parameter, row 0 for ``a -> b``
    (iSogCLR); otherwise as :class:`GlobalTemperature`."""

    mode: ClassVar[str] = "per_sample"

    def initial(self, temperature: float, num_samples: int) -> Tensor:
        return torch.full((2, num_samples), temperature)

    def of_batch(self, temperature: Tensor, direction: int, index: Tensor,
                 dtype: torch.dtype) -> Tensor:
        tau = temperature[direction][index.to(temperature.device)]  # (B,)
        return tau.to(device=index.device, dtype=dtype)


#: ``temperature_mode`` -> its strategy.
TEMPERATURE_MODES = {cls.mode: cls for cls in (FixedTemperature, GlobalTemperature,
                                               PerSampleTemperature)}


def temperature_strategy(where: str, mode: str, *, rho: float,
                         min_temperature: float) -> FixedTemperature:
    """The strategy of ``mode``, its settings checked.

    Raises:
        CrlValueError / CrlTypeError: for an unknown mode, a non-finite ``rho`` or a
            non-positive ``min_temperature``.

    Example:
        >>> type(temperature_strategy("f", "per_sample", rho=6.5, min_temperature=1e-3)).__name__
        'PerSampleTemperature'
    """
    cls = TEMPERATURE_MODES[check_choice(where, "temperature_mode", mode, tuple(TEMPERATURE_MODES))]
    check_positive(where, "min_temperature", min_temperature, allow_tensor=False)
    if not isinstance(rho, (int, float)) or isinstance(rho, bool) or not math.isfinite(rho):
        raise CrlTypeError(f"{where}: `rho` must be a finite number; got {describe(rho)}")
    return cls(rho, min_temperature)


__all__ = ["TEMPERATURE_MODES", "FixedTemperature", "GlobalTemperature", "PerSampleTemperature",
           "temperature_strategy"]
