"""The report's sentences: the recommendation in the user's units with its budget restated,
the fallback to the nearest measured cell in plain words, and the theory's prediction with its
derivation."""

from __future__ import annotations

import math

import pytest

from crl.experiments.negatives.laws import Recommendation
from crl.experiments.negatives.text import Budget, prediction_text, recommendation_text

BUDGET = Budget(samples=12_000, batch_size=128, target_n=17_908, epochs_at_target=94 / 139)


@pytest.mark.parametrize("regime, units", [
    ("shared", "a batch of about 4,107"), ("independent", "an independent set of m = 4,106")])
def test_a_law_recommendation_speaks_in_the_users_units_and_restates_the_budget(
        regime: str, units: str) -> None:
    rec = Recommendation(regime, 17_908, "law", 4106.2, 315.0, 17_908.0, 17_908, True,
                         "the law fits")
    text = recommendation_text(rec, BUDGET)
    assert "use m of about 4,106 per anchor" in text and "extrapolation" in text
    assert units in text
    assert "12,000 samples per run at batch 128" in text and "0.676 epochs" in text
    assert "more anchors" not in text


def test_a_law_that_does_not_fit_falls_back_to_the_measured_cell_in_plain_words() -> None:
    rec = Recommendation("independent", 17_908, "nearest cell", 2932.0, 2459.0, 3374.0, 15_000,
                         False, "the law does not fit (...)")
    text = recommendation_text(rec, BUDGET)
    assert "one power law does not describe these cells, so no m is extrapolated" in text
    assert "n = 15,000, has m* = 2,932 (95% interval [2,459, 3,374])" in text
    assert "12,000 samples per run" in text
    bounds = Recommendation("shared", 17_908, "nearest cell", None, 700.0, math.inf, 15_000,
                            False, "the law is untested")
    assert "only bounds m* to [700, ∞]" in recommendation_text(bounds, BUDGET)


def test_the_prediction_is_per_regime_with_its_derivation_and_source() -> None:
    text = prediction_text()
    assert "docs/theory.md §7" in text
    assert "alpha = 1/2 with independent sets, alpha = 1 with a shared set" in text
    assert "ordering" not in text
