"""The ``negatives`` section of a run config and the builder the trainer calls.

``regime="in_batch"`` (the default) is the plain setting of every library: each anchor's negatives
are the other ``B - 1`` batch members, so m is tied to the batch size. ``"shared"`` and
``"independent"`` fix m (absolute, or as a fraction of n) independently of B; see
``docs/negatives.md`` for how m, n and B interact.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor

from crl.errors import CrlValueError
from crl.negatives.sets import NegativeSets


class NegativesConfig(BaseModel):
    """Who the negatives of an anchor are.

    Attributes:
        regime: ``"in_batch"`` (every other batch member), ``"shared"`` (one set of m for all
            anchors, SSCRL) or ``"independent"`` (a set of m per anchor, SCRL).
        m: Negatives per anchor (absolute). Exactly one of ``m`` / ``m_fraction`` is required
            unless ``regime == "in_batch"``, where both must be unset.
        m_fraction: m as a fraction of n, in ``(0, 1]``; resolved to ``max(1, round(f * n))``.
        seed: Seed of the sets (they are a deterministic function of it).
        exclude_same_label: Also drop same-label candidates (false negatives); needs labels.

    Example:
        >>> NegativesConfig(regime="shared", m_fraction=0.1).resolve_m(1000)
        100
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    regime: Literal["shared", "independent", "in_batch"] = "in_batch"
    m: int | None = Field(default=None, ge=1)
    m_fraction: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int = Field(default=0, ge=0)
    exclude_same_label: bool = False

    @model_validator(mode="after")
    def _one_size(self) -> NegativesConfig:
        given = [name for name in ("m", "m_fraction") if getattr(self, name) is not None]
        if self.regime == "in_batch" and given:
            raise ValueError(
                f"{' and '.join(given)} must be unset when regime is 'in_batch' (there m = B - 1); "
                f"got {', '.join(f'{g}={getattr(self, g)!r}' for g in given)}; "
                "set regime to 'shared' or 'independent' to fix m"
            )
        if self.regime != "in_batch" and len(given) != 1:
            got = ("neither" if not given
                   else f"both (m={self.m!r}, m_fraction={self.m_fraction!r})")
            raise ValueError(
                f"exactly one of m / m_fraction is required when regime is {self.regime!r}; "
                f"got {got}"
            )
        return self

    def resolve_m(self, n: int) -> int:
        """m for a training set of ``n`` pairs (``m_fraction`` rounded, at least 1, at most n).

        Raises:
            CrlValueError: for ``regime == "in_batch"``, or an absolute ``m > n``.
        """
        if self.regime == "in_batch":
            raise CrlValueError("NegativesConfig.resolve_m: regime 'in_batch' has no fixed m "
                                "(each anchor uses the other B - 1 batch members)")
        if self.m is not None:
            if self.m > n:
                raise CrlValueError(
                    f"negatives.m must be at most the number of training pairs n = {n}; "
                    f"got m = {self.m} (use m_fraction for a size relative to n)"
                )
            return self.m
        assert self.m_fraction is not None  # guaranteed by the validator
        return min(n, max(1, round(self.m_fraction * n)))


def build_negative_sets(cfg: NegativesConfig, n: int,
                        labels: Tensor | None = None) -> NegativeSets | None:
    """The :class:`NegativeSets` a config asks for, or None for ``regime="in_batch"``.

    Args:
        cfg: The ``negatives`` section of a run config.
        n: Number of training pairs.
        labels: ``(n,)`` labels of the training samples; required when
            ``cfg.exclude_same_label`` (ignored otherwise).

    Returns:
        None for ``"in_batch"`` (the losses' default every-other-member mask applies; with
        ``exclude_same_label`` the trainer removes same-label pairs from that mask itself), else
        the sets.

    Raises:
        CrlValueError: if ``exclude_same_label`` is set without labels, or m > n.

    Example:
        >>> sets = build_negative_sets(NegativesConfig(regime="independent", m=5), n=100)
        >>> sets.m, sets.regime
        (5, 'independent')
        >>> build_negative_sets(NegativesConfig(), n=100) is None
        True
    """
    if cfg.exclude_same_label and labels is None:
        raise CrlValueError(
            "build_negative_sets: negatives.exclude_same_label is true but the dataset has no "
            "labels; got labels=None (set exclude_same_label to false or use labelled data)"
        )
    if cfg.regime == "in_batch":
        return None
    return NegativeSets(n, cfg.resolve_m(n), regime=cfg.regime, seed=cfg.seed,
                        labels=labels if cfg.exclude_same_label else None)


__all__ = ["NegativesConfig", "build_negative_sets"]
