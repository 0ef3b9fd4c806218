"""The report's verdict on alpha against the theory's range is decided by the interval, not by
the point estimate alone."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crl.experiments.negatives.paper import PAPER
from crl.experiments.negatives.text import range_verdict


@pytest.mark.parametrize(("alpha", "ci", "start"), [
    (0.7, (0.55, 0.9), "inside the range"),
    (0.28, (-0.26, 0.47), "outside the range"),
    (1.4, (1.1, 1.8), "outside the range"),
    (-0.04, (-0.52, 0.81), "the point lies outside the range"),
    (0.6, (0.3, 0.9), "the point lies inside the range"),
    (0.6, (math.nan, math.nan), "its interval is not identified"),
])
def test_verdict(alpha: float, ci: tuple[float, float], start: str) -> None:
    text = range_verdict(alpha, ci)
    assert text.startswith(start), text
    assert "(0.5 to 1)" in text


@given(st.floats(-3, 3), st.floats(-3, 3), st.floats(-3, 3))
def test_the_interval_decides(alpha: float, a: float, b: float) -> None:
    lo, hi = min(a, b), max(a, b)
    text = range_verdict(alpha, (lo, hi))
    low, high = PAPER.alpha_range
    overlaps = lo <= high and hi >= low
    contained = low <= lo and hi <= high
    assert text.startswith("inside") == contained
    assert text.startswith("outside") == (not overlaps)
    assert ("neither confirm nor rule out" in text) == (overlaps and not contained)
