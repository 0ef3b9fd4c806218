"""The verify stage: its plan from the recommendations, its verdict on planted measurements at
the target n (within the tolerance of the best, or not, paired over seeds), and the plan
recorded so that a re-run trains the same runs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from crl.errors import CrlValueError
from crl.experiments.negatives.arms import arm
from crl.experiments.negatives.laws import Recommendation
from crl.experiments.negatives.options import VERIFY_FILE, VERIFY_SEEDS
from crl.experiments.negatives.study import NegativesStudy
from crl.experiments.negatives.tolerance import Tolerance
from crl.experiments.negatives.verify import (
    VerifyPlan,
    plan_resolution_round,
    plan_second_round,
    plan_third_round,
    plan_verify,
    verify_result,
    verify_seeds,
    verify_text,
)
from crl.rundir import write_json

TARGET = 5000


def _rec(regime: str, m: float | None, low: float = 0.0, high: float = math.inf,
         source: str = "law") -> Recommendation:
    return Recommendation(regime, TARGET, source, m, low, high, TARGET, False, "planted")


def test_the_plan_is_half_the_value_twice_and_the_largest_m_with_five_seeds() -> None:
    plans = plan_verify({"shared": _rec("shared", 600.4, 400, 900),
                         "independent": _rec("independent", None, 3000, math.inf,
                                             source="nearest cell"),
                         "none": _rec("none", None)}, TARGET, TARGET, (0, 1))
    assert [p.regime for p in plans] == ["shared", "independent"]  # no value: not verified
    shared, independent = plans
    assert shared.m_rec == 600 and shared.ms == (300, 600, 1201, TARGET)
    assert shared.seeds == (0, 1, 2, 3, 4) == verify_seeds((0, 1)) and VERIFY_SEEDS == 5
    [three] = plan_verify({"shared": _rec("shared", 600.4)}, TARGET, TARGET, (0, 1), 3)
    assert three.seeds == (0, 1, 2) and three.ms == shared.ms
    assert verify_seeds(tuple(range(7)), 3) == tuple(range(7))  # the grid's seeds all stay
    with pytest.raises(CrlValueError, match=r"--verify-seeds.*at least 3; got 2"):
        verify_seeds((0,), 2)
    assert independent.m_rec == 3000 and independent.ms == (1500, 3000, TARGET)  # 2x capped
    assert "lower bound" in independent.source
    assert VerifyPlan.from_dict(shared.to_dict()) == shared


def _rows(plan: VerifyPlan, curve: dict[int, float], *, noise: float, seed: int = 0
          ) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    rows = []
    for s in plan.seeds:
        level = rng.normal(0, 0.03)  # shared by the seed's runs: the pairing removes it
        for m in plan.ms:
            rows.append({"regime": plan.regime, "n": plan.target_n, "m": m, "seed": s,
                         "arm": "verify", "error": -(curve[m] + level + rng.normal(0, noise))})
    return rows


@pytest.mark.parametrize(("gap", "verdict"), [(0.002, "within"), (0.03, "not within")])
def test_a_planted_gap_below_or_above_the_tolerance(gap: float, verdict: str) -> None:
    plan = VerifyPlan("shared", TARGET, 600, (300, 600, 1200, TARGET), (0, 1, 2, 3), "law")
    curve = {300: 0.40, 600: 0.45 - gap, 1200: 0.45, TARGET: 0.449}
    rows = _rows(plan, curve, noise=0.001)
    r = verify_result(plan, rows, "error", False, Tolerance(0.01))  # an error: lower is better
    assert r is not None and r.verdict == verdict and r.best_m == 1200
    assert r.difference == pytest.approx(gap, abs=0.003)
    assert r.interval[0] <= r.difference <= r.interval[1] and r.exact
    text = verify_text(r, "error", False)
    assert f"m_rec = {plan.m_rec:,}" in text and verdict in text
    assert r.to_dict(False)["means"][1] == pytest.approx(-(0.45 - gap), abs=0.01)


def test_noise_leaves_the_interval_past_the_tolerance() -> None:
    plan = VerifyPlan("shared", TARGET, 600, (300, 600, 1200), (0, 1, 2), "law")
    rows = _rows(plan, {300: 0.40, 600: 0.447, 1200: 0.45}, noise=0.02, seed=3)
    r = verify_result(plan, rows, "error", False, Tolerance(0.01))
    assert r is not None and r.interval[1] > r.tolerance_points
    assert r.verdict != "within"
    # nothing at m_rec yet: no result
    assert verify_result(plan, [x for x in rows if x["m"] != 600], "error", False,
                         Tolerance(0.01)) is None


def _smoke_study(tmp_path: Path, plan: VerifyPlan | None = None) -> NegativesStudy:
    """A smoke study with the verify stage at n = 256, its state read from ``tmp_path`` (where
    ``plan``, when given, is first recorded as the verify stage's plan)."""
    study = NegativesStudy("smoke", data="synthetic", ns=[64, 128], fractions=[0.25, 1.0],
                           seeds=[0], verify=True, target_n=256)
    if plan is not None:
        write_json(tmp_path / VERIFY_FILE, {"plans": [plan.to_dict()]})
    study.load_state(tmp_path)
    return study


def test_the_recorded_plan_is_trained_and_kept_apart(tmp_path: Path) -> None:
    plan = VerifyPlan("shared", 256, 32, (16, 32, 64, 256), (0, 1, 2), "law")
    study = _smoke_study(tmp_path, plan)
    specs = [s for s in study.runs() if s.tags.get("arm") == "verify"]
    assert len(specs) == 12 and {s.tags["n"] for s in specs} == {256}
    assert {s.config["data"]["num_train"] for s in specs} == {256}
    assert all(arm(s.tags) == "verify" for s in specs)
    # planned once: the stage adds nothing when a plan is on disk
    assert study._plan_verify([], tmp_path) == 0
    assert not NegativesStudy("smoke", data="synthetic").verify
    assert NegativesStudy("full", data="synthetic").verify


def test_a_second_round_brackets_the_answer_at_the_target_n(tmp_path: Path) -> None:
    # Planted: the metric saturates at m = 2,000 (0.45 from there on); m_rec = 600 is 0.03
    # below it, so the first round finds it not within, and the answer lies in (1,200, 5,000].
    def curve(m: int) -> float:
        return 0.45 - 0.03 * max(0.0, math.log(2000 / m)) / math.log(2000 / 600)

    plan = VerifyPlan("shared", TARGET, 600, (300, 600, 1200, TARGET), (0, 1, 2), "law")
    first = verify_result(plan, _rows(plan, {m: curve(m) for m in plan.ms}, noise=0.0005),
                          "error", False, Tolerance(0.01))
    assert first is not None and first.verdict == "not within"
    assert (first.below_m, first.measured_m) == (1200, TARGET)
    second = plan_second_round(first)
    assert second.ms == plan.ms and second.second_round == (1931, 3107)  # even in log m
    assert second.all_ms == (300, 600, 1200, 1931, 3107, TARGET)
    assert VerifyPlan.from_dict(second.to_dict()) == second
    assert plan_second_round(first) == second and plan_second_round(
        verify_result(second, _rows(second, {m: curve(m) for m in second.all_ms}, noise=0.0005),
                      "error", False, Tolerance(0.01)) or first) == second  # one round only
    # without the second round's runs there is no result yet; with them, the bracket narrows
    full = VerifyPlan(**{**second.__dict__, "ms": second.all_ms})
    rows = _rows(full, {m: curve(m) for m in full.ms}, noise=0.0005)
    assert verify_result(second, [r for r in rows if r["m"] != 1931], "error", False,
                         Tolerance(0.01)) is None
    done = verify_result(second, rows, "error", False, Tolerance(0.01))
    assert done is not None and done.verdict == "not within"  # still m_rec's verdict
    assert (done.below_m, done.measured_m) == (1200, 1931)  # 1,931: 0.001 below the top
    # the answer is read from the runs' own curve at the target n and checked on them
    assert done.cell is not None and done.cell.n == TARGET and done.cell.seeds == (0, 1, 2)
    assert done.check is not None and done.check.m >= (done.cell.m_star or done.cell.lower)
    assert done.check.verdict == "within" and done.check.m == 1931
    words = verify_text(done, "error", False)
    assert "m = 1,931, the smallest measured m at or above that reading" in words
    assert "this is the recommendation" in words
    # a within verdict plans nothing more
    easy = verify_result(plan, _rows(plan, {300: 0.40, 600: 0.449, 1200: 0.45, TARGET: 0.45},
                                     noise=0.0005), "error", False, Tolerance(0.01))
    assert easy is not None and plan_second_round(easy) == plan and easy.measured_m == 600


def test_the_study_plans_the_second_round_once(tmp_path: Path) -> None:
    plan = VerifyPlan("shared", 256, 16, (8, 16, 32, 256), (0, 1, 2), "law")
    study = _smoke_study(tmp_path, plan)
    curve = {8: 0.30, 16: 0.32, 32: 0.405, 256: 0.41}  # 16 not within; the answer in (16, 32]
    rows = [{**r, "recall@1": -float(r.pop("error"))}  # type: ignore[arg-type]
            for r in _rows(plan, curve, noise=0.0005)]
    rows = [{**r, "retrieval/x2y_recall@1": r["recall@1"], "retrieval/y2x_recall@1":
             r["recall@1"], "run_id": f"r{i}"} for i, r in enumerate(rows)]
    before = len(study.runs())
    added = study._plan_second_round(rows, tmp_path)
    assert added == 6 and len(study.runs()) == before + 6  # m = 20 and 25, three seeds
    assert study.verify_plans[0].second_round == (20, 25)
    assert study._plan_second_round(rows, tmp_path) == 0  # once
    again = _smoke_study(tmp_path)  # a resumed study reads the second round back
    assert again.second_round_planned and again.verify_plans == study.verify_plans


def _every_round(plan: VerifyPlan, curve: dict[int, float], *, noise: float = 0.0005
                 ) -> list[dict[str, object]]:
    """:func:`_rows` at every m of every round of ``plan``."""
    return _rows(VerifyPlan(**{**plan.__dict__, "ms": plan.all_ms}), curve, noise=noise)


def _recall_rows(plan: VerifyPlan, curve: dict[int, float]) -> list[dict[str, object]]:
    rows = [{**r, "recall@1": -float(r.pop("error"))}  # type: ignore[arg-type]
            for r in _every_round(plan, curve)]
    return [{**r, "retrieval/x2y_recall@1": r["recall@1"], "retrieval/y2x_recall@1":
             r["recall@1"], "run_id": f"r{i}"} for i, r in enumerate(rows)]


def test_a_third_round_locates_an_answer_the_runs_only_bound() -> None:
    # Planted: a curve rising in log m up to m = 2,000 and flat after (0.45); the first and
    # second rounds measured up to m = 1,200 and then the target n: m* lies in the last step
    # (1,200, 5,000], so the reading only bounds it, and the third round measures inside.
    def curve(m: int) -> float:
        return 0.45 - 0.04 * max(0.0, math.log(2000 / m)) / math.log(2000 / 300)

    plan = VerifyPlan("shared", TARGET, 600, (300, 600, 1200, TARGET), (0, 1, 2), "law",
                      (800, 1000))
    first = verify_result(plan, _every_round(plan, {m: curve(m) for m in plan.all_ms}),
                          "error", False, Tolerance(0.01))
    assert first is not None and first.cell is not None and first.cell.m_star is None
    assert first.cell.status == "above" and first.cell.lower == 1200
    third = plan_third_round(first)
    assert third.third_round == (1931, 3107) and third.second_round == plan.second_round
    assert VerifyPlan.from_dict(third.to_dict()) == third
    assert 1931 in third.all_ms and plan_third_round(first) == third  # deterministic
    rows = _every_round(third, {m: curve(m) for m in third.all_ms})
    assert verify_result(third, [r for r in rows if r["m"] != 3107], "error", False,
                         Tolerance(0.01)) is None  # waits for the third round's runs
    done = verify_result(third, rows, "error", False, Tolerance(0.01))
    assert done is not None and done.cell is not None and done.cell.m_star is not None
    assert 1200 < done.cell.lower <= done.cell.m_star <= done.cell.upper <= 3107
    assert plan_third_round(done) == third  # once
    assert "a third round at m = 1,931, 3,107" in verify_text(done, "error", False)
    # a located reading plans nothing; "at most the smallest m" halves below it
    located = verify_result(third, rows, "error", False, Tolerance(0.05))
    assert located is not None and plan_third_round(located) == third
    flat = VerifyPlan("shared", TARGET, 600, (300, 600, 1200, TARGET), (0, 1, 2), "law")
    saturated = verify_result(flat, _rows(flat, {m: 0.45 for m in flat.ms}, noise=0.0005),
                              "error", False, Tolerance(0.01))
    assert saturated is not None and saturated.cell is not None
    assert saturated.cell.status == "below"
    assert plan_third_round(saturated).third_round == (75, 150)


def test_the_study_plans_the_third_round_once(tmp_path: Path) -> None:
    plan = VerifyPlan("shared", 256, 16, (8, 16, 32, 256), (0, 1, 2), "law", (20, 25))
    study = _smoke_study(tmp_path, plan)
    curve = {8: 0.30, 16: 0.33, 20: 0.35, 25: 0.37, 32: 0.38, 256: 0.41}  # bound: (32, 256]
    rows = _recall_rows(plan, curve)
    before = len(study.runs())
    added = study._plan_third_round(rows, tmp_path)
    third = study.verify_plans[0].third_round
    assert len(third) == 2 and all(32 < m < 256 for m in third)
    assert added == 6 and len(study.runs()) == before + 6
    assert study._plan_third_round(rows, tmp_path) == 0  # once
    again = _smoke_study(tmp_path)
    assert again.third_round_planned and again.verify_plans == study.verify_plans


def test_a_resolution_round_measures_inside_a_wide_step_around_the_reading() -> None:
    # Planted: a curve that rises in log m up to m = 2,000 and is flat after; measured at 300,
    # 600, 1,200 and 4,000 (3.3x apart above 1,200) and the target n. The reading falls in
    # (1,200, 4,000]: located, but where in that step the curve's form decides, so the
    # resolution round measures 2 m inside it; a finer step plans nothing.
    def curve(m: int) -> float:
        return 0.45 - 0.04 * max(0.0, math.log(2000 / m)) / math.log(2000 / 300)

    plan = VerifyPlan("shared", TARGET, 600, (300, 600, 1200, 4000, TARGET), (0, 1, 2), "law")
    first = verify_result(plan, _every_round(plan, {m: curve(m) for m in plan.all_ms}),
                          "error", False, Tolerance(0.01))
    assert first is not None and first.cell is not None and first.cell.m_star is not None
    assert 1200 < first.cell.m_star <= 4000
    assert plan_third_round(first) == plan  # located: no third round
    fine = plan_resolution_round(first)
    assert fine.resolution_round == (1793, 2678) and fine.third_round == ()
    assert VerifyPlan.from_dict(fine.to_dict()) == fine and 2678 in fine.all_ms
    assert plan_resolution_round(first, step=4.0) == plan  # 3.3x is fine at a 4x step
    rows = _every_round(fine, {m: curve(m) for m in fine.all_ms})
    assert verify_result(fine, [r for r in rows if r["m"] != 2678], "error", False,
                         Tolerance(0.01)) is None  # waits for the round's runs
    done = verify_result(fine, rows, "error", False, Tolerance(0.01))
    assert done is not None and done.cell is not None and done.cell.m_star is not None
    assert plan_resolution_round(done) == fine  # once
    # planted m* (within 0.01 of the plateau: 2000 * (300/2000)^(1/4)) is about 1,245
    assert done.cell.lower <= 2000 * (300 / 2000) ** 0.25 <= done.cell.upper


def test_the_study_plans_the_resolution_round_once(tmp_path: Path) -> None:
    plan = VerifyPlan("shared", 256, 16, (8, 16, 64, 256), (0, 1, 2), "law")
    study = _smoke_study(tmp_path, plan)
    curve = {8: 0.30, 16: 0.36, 64: 0.405, 256: 0.41}  # located in (16, 64]: a 4x step
    rows = _recall_rows(plan, curve)
    assert study._plan_third_round(rows, tmp_path) == 0  # located: no third round
    added = study._plan_resolution_round(rows, tmp_path)
    fine = study.verify_plans[0].resolution_round
    assert fine == (25, 40) and added == 6  # two m, three seeds
    assert study._plan_resolution_round(rows, tmp_path) == 0  # once
    again = _smoke_study(tmp_path)
    assert again.resolution_round_planned and again.verify_plans == study.verify_plans
