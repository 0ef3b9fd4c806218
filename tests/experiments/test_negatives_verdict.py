"""The theory per regime against planted alphas (crl.experiments.negatives.verdict)."""

from __future__ import annotations

import math

import pytest

from crl.experiments.negatives.laws import LawFit, fit_law
from crl.experiments.negatives.verdict import (
    PREDICTED_ALPHA,
    difference_verdict,
    judge,
    regime_verdict,
)
from negatives_planted import cell


def _law(regime: str, alpha: float, ci: tuple[float, float] | None,
         verdict: str = "fits") -> LawFit:
    return LawFit(regime, True, alpha, 0.0, 0.0, ci, (), 1.0, 2, 0.5, verdict, "planted", ())


def test_the_prediction_is_per_regime() -> None:
    assert PREDICTED_ALPHA == {"independent": 0.5, "shared": 1.0}


@pytest.mark.parametrize("regime, alpha", [("independent", 0.5), ("shared", 1.0)])
def test_the_predicted_alpha_is_consistent(regime: str, alpha: float) -> None:
    v = regime_verdict(_law(regime, alpha, (alpha - 0.15, alpha + 0.15)))
    assert v.verdict == "consistent" and "consistent" in v.sentence


@pytest.mark.parametrize("regime, alpha", [("independent", 1.0), ("shared", 0.5)])
def test_reversed_alphas_are_contradicted(regime: str, alpha: float) -> None:
    v = regime_verdict(_law(regime, alpha, (alpha - 0.12, alpha + 0.12)))
    assert v.verdict == "contradicted"
    assert ("below" if regime == "shared" else "above") in v.sentence


@pytest.mark.parametrize("ci", [(0.3, 1.2), (0.45, 1.05), (-1.0, 0.3), None,
                                (0.2, math.inf)])
def test_a_wide_or_missing_interval_cannot_tell(ci: tuple[float, float] | None) -> None:
    assert regime_verdict(_law("independent", 0.6, ci)).verdict == "cannot tell"


def test_a_law_that_does_not_fit_cannot_tell() -> None:
    v = regime_verdict(_law("shared", 1.0, (0.9, 1.1), verdict="does not fit"))
    assert v.verdict == "cannot tell" and "no single alpha" in v.sentence


def test_the_difference_between_regimes() -> None:
    agrees = difference_verdict(_law("shared", 1.0, (0.9, 1.1)),
                                _law("independent", 0.5, (0.4, 0.6)))
    assert agrees.verdict == "consistent" and agrees.estimate == pytest.approx(0.5)
    assert agrees.interval is not None
    assert agrees.interval[0] == pytest.approx(0.5 - math.hypot(0.1, 0.1))
    assert "order agrees" in agrees.sentence
    reversed_ = difference_verdict(_law("shared", 0.5, (0.4, 0.6)),
                                   _law("independent", 1.0, (0.9, 1.1)))
    assert reversed_.verdict == "contradicted" and "reversed" in reversed_.sentence
    wide = difference_verdict(_law("shared", 0.8, (0.4, 1.2)),
                              _law("independent", 0.6, (0.3, 0.9)))
    assert wide.verdict == "cannot tell"


def test_judge_boundaries() -> None:
    assert judge((0.5, 0.9), 0.5, 1.0)[0] == "consistent"  # the end counts as inside
    assert judge((0.1, 1.3), 0.5, 1.0) == ("cannot tell", "the interval is wider than 1")


def test_planted_laws_end_to_end() -> None:
    """Cells on m* = n^0.5 (independent) and m* = 0.1 n (shared) give consistent verdicts;
    swapping the regimes' cells gives contradicted ones."""
    ns = [500, 1000, 2000, 4000, 8000, 16000]

    def cells(regime: str, alpha: float, c: float) -> list:
        return [cell(n, math.exp(c) * n ** alpha, math.exp(c) * n ** alpha / 1.15,
                     math.exp(c) * n ** alpha * 1.15, regime=regime) for n in ns]

    good = cells("independent", 0.5, 0.0) + cells("shared", 1.0, math.log(0.1))
    verdicts = [regime_verdict(fit_law(good, r)).verdict for r in ("independent", "shared")]
    assert verdicts == ["consistent", "consistent"]
    bad = cells("independent", 1.0, math.log(0.1)) + cells("shared", 0.5, 0.0)
    laws = {r: fit_law(bad, r) for r in ("independent", "shared")}
    assert [regime_verdict(laws[r]).verdict for r in laws] == ["contradicted"] * 2
    assert difference_verdict(laws["shared"], laws["independent"]).verdict == "contradicted"
