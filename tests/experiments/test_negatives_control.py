"""The control arm tells m from the negatives per step k = B m / n on planted answers: a metric
that depends on m, one that depends on k (the confound), and a flat one it cannot tell
(docs/theory.md §7, "m or k"); and the arm's runs through the study's grid."""

from __future__ import annotations

import math

import numpy as np
import pytest

from crl.experiments.negatives.arms import arm
from crl.experiments.negatives.control import control_batch, control_result, control_text
from crl.experiments.negatives.study import NegativesStudy
from crl.experiments.negatives.tolerance import Tolerance
from negatives_planted import arm_rows

N, B = 1000, 128


def _rising(m: float) -> float:
    """Saturating in log m: most of its rise between m = 10 and m = 300."""
    return 0.3 + 0.2 * math.tanh((math.log(m) - math.log(60)) / 1.2)


def _split(rows: list[dict[str, object]]) -> tuple[list[dict[str, object]], ...]:
    return ([r for r in rows if arm(r) == "main"], [r for r in rows if arm(r) == "control"])


@pytest.mark.parametrize("depends_on", ["m", "k"])
def test_a_planted_curve_in_m_or_in_k_is_told_apart(depends_on: str) -> None:
    main, ctrl = _split(arm_rows(N, B, control_batch(B), _rising, depends_on=depends_on))
    for regime in ("shared", "independent"):
        r = control_result(main, ctrl, "score", True, Tolerance(0.01), regime=regime, n=N,
                           batch=B, control_batch=control_batch(B))
        assert r is not None and r.ratio == 4 and len(r.seeds) == len(r.per_seed) == 4
        assert r.verdict == depends_on, (r.slope, r.interval, r.reason)
        truth = 0.0 if depends_on == "m" else 1.0
        assert abs(r.slope - truth) < 0.15  # the interpolation bias (control.py) is small
        assert r.level == pytest.approx(-0.01, abs=0.01)  # the batch's own level shift
        assert f"b = {r.slope:.2f}" in control_text(r)


def test_a_flat_curve_cannot_tell_and_lower_is_better_is_oriented() -> None:
    main, ctrl = _split(arm_rows(N, B, 32, lambda m: 0.4, depends_on="k"))
    r = control_result(main, ctrl, "score", True, Tolerance(0.01), regime="shared", n=N,
                       batch=B, control_batch=32)
    assert r is not None and r.verdict == "cannot tell" and "predict the same" in r.reason
    # an error (lower is better) that follows k: the same verdict on the negated scores
    main, ctrl = _split(arm_rows(N, B, 32, lambda m: -_rising(m), depends_on="k"))
    r = control_result(main, ctrl, "score", False, Tolerance(0.01), regime="shared", n=N,
                       batch=B, control_batch=32)
    assert r is not None and r.verdict == "k"


def test_noise_never_turns_one_answer_into_the_other() -> None:
    """Over 48 noisy planted tables (3 to 6 seeds), m is never read as k nor k as m: noise
    gives "cannot tell"; at the largest noise the arm cannot tell at all."""
    seen: dict[tuple[str, float], set[str]] = {}
    for depends_on in ("m", "k"):
        for seeds, noise in ((3, 0.05), (6, 0.05), (6, 0.2)):
            for table in range(8 if noise < 0.1 else 4):
                main, ctrl = _split(arm_rows(N, B, 32, _rising, depends_on=depends_on,
                                             noise=noise, seeds=seeds, seed=table,
                                             regimes=("shared",)))
                r = control_result(main, ctrl, "score", True, Tolerance(0.01),
                                   regime="shared", n=N, batch=B, control_batch=32)
                assert r is not None
                seen.setdefault((depends_on, noise), set()).add(r.verdict)
    assert seen[("m", 0.05)] <= {"m", "cannot tell"} and seen[("k", 0.05)] <= {"k", "cannot tell"}
    assert seen[("m", 0.2)] == seen[("k", 0.2)] == {"cannot tell"}


def test_too_few_usable_m_gives_no_result() -> None:
    rows = arm_rows(N, B, 32, _rising, depends_on="m", fractions=(0.01, 0.02, 0.5, 1.0))
    main, ctrl = _split(rows)  # m / 4 inside the swept range only at 50% and 100%
    assert control_result(main, ctrl, "score", True, Tolerance(0.01), regime="shared", n=N,
                          batch=B, control_batch=32) is None


def test_the_arm_trains_the_same_m_at_a_quarter_of_the_batch() -> None:
    study = NegativesStudy("smoke", data="synthetic", ns=[64, 256], fractions=[0.1, 0.5, 1.0],
                           seeds=[0, 1], batch_size=64, control=True)
    specs = study.runs()
    ctrl = [s for s in specs if s.tags.get("arm") == "control"]
    main = [s for s in specs if "arm" not in s.tags]
    assert {s.tags["n"] for s in ctrl} == {256} and study.control_batch == 16
    assert {s.config["train"]["batch_size"] for s in ctrl} == {16}
    assert {(s.tags["m"], s.tags["regime"], s.tags["seed"]) for s in ctrl} == \
        {(s.tags["m"], s.tags["regime"], s.tags["seed"]) for s in main if s.tags["n"] == 256}
    for s in ctrl:  # same training in samples; k recorded at the control's batch
        assert s.config["train"]["max_samples"] == study.grid.budget
        assert s.tags["negatives_per_step"] == pytest.approx(16 * s.tags["m"] / 256)
    # off by default outside the full preset: the grid's runs are unchanged
    plain = NegativesStudy("smoke", data="synthetic", ns=[64, 256], fractions=[0.1, 0.5, 1.0],
                           seeds=[0, 1], batch_size=64)
    assert {s.run_id for s in plain.runs()} == {s.run_id for s in main}
    assert NegativesStudy("full", data="synthetic").control


def test_control_n_must_be_swept() -> None:
    from crl.errors import CrlValueError

    with pytest.raises(CrlValueError, match="--control-n"):
        NegativesStudy("smoke", data="synthetic", control=True, control_n=100)
    assert np.isclose(control_batch(3), 2)
