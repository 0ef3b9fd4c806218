"""The `negatives` config section and the builder the trainer calls."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from crl.errors import CrlValueError
from crl.negatives import NegativesConfig, NegativeSets, build_negative_sets


def test_default_is_in_batch_and_builds_nothing() -> None:
    cfg = NegativesConfig()
    assert cfg.regime == "in_batch"
    assert build_negative_sets(cfg, n=100) is None


@pytest.mark.parametrize("regime", ["shared", "independent"])
def test_absolute_and_fractional_m(regime: str) -> None:
    sets = build_negative_sets(NegativesConfig(regime=regime, m=7, seed=3), n=50)  # type: ignore[arg-type]
    assert isinstance(sets, NegativeSets)
    assert (sets.m, sets.regime, sets.seed) == (7, regime, 3)
    frac = build_negative_sets(NegativesConfig(regime=regime, m_fraction=0.25), n=50)  # type: ignore[arg-type]
    assert frac is not None and frac.m == 12  # round(12.5) -> 12 (banker's), at least 1
    tiny = build_negative_sets(NegativesConfig(regime=regime, m_fraction=0.001), n=50)  # type: ignore[arg-type]
    assert tiny is not None and tiny.m == 1
    whole = build_negative_sets(NegativesConfig(regime=regime, m_fraction=1.0), n=50)  # type: ignore[arg-type]
    assert whole is not None and whole.m == 50


def test_exactly_one_size_is_required_and_errors_name_the_field() -> None:
    with pytest.raises(ValidationError, match="m_fraction"):
        NegativesConfig(regime="shared")
    with pytest.raises(ValidationError, match="m_fraction"):
        NegativesConfig(regime="shared", m=3, m_fraction=0.1)
    with pytest.raises(ValidationError, match="in_batch"):
        NegativesConfig(m=3)
    with pytest.raises(ValidationError, match="m_fraction"):
        NegativesConfig(regime="shared", m_fraction=1.5)
    with pytest.raises(ValidationError, match="m"):
        NegativesConfig(regime="shared", m=0)
    with pytest.raises(ValidationError, match=r"mm"):
        NegativesConfig.model_validate({"regime": "shared", "m": 3, "mm": 1})
    with pytest.raises(CrlValueError, match=r"negatives\.m"):
        build_negative_sets(NegativesConfig(regime="shared", m=51), n=50)


def test_same_label_exclusion_needs_labels() -> None:
    cfg = NegativesConfig(regime="independent", m=10, exclude_same_label=True)
    with pytest.raises(CrlValueError, match="exclude_same_label"):
        build_negative_sets(cfg, n=30)
    labels = torch.arange(30) % 3
    sets = build_negative_sets(cfg, n=30, labels=labels)
    assert sets is not None
    mask = sets.mask(torch.arange(30), torch.arange(30))
    assert not (mask & (labels.unsqueeze(1) == labels.unsqueeze(0))).any()
    # without the flag the labels are ignored
    plain = build_negative_sets(NegativesConfig(regime="independent", m=10), n=30, labels=labels)
    assert plain is not None and plain.labels is None
