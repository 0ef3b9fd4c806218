"""The negatives study's later stages end to end on a tiny grid: the training stated as epochs
(every n trains them; every recommendation restates it), the control arm at a quarter of the
batch, and the verify stage at the target n, interrupted and resumed by the same call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crl.errors import CrlValueError
from crl.experiments.api import run_and_report
from crl.experiments.negatives import NegativesStudy
from crl.experiments.negatives import verify as verify_module
from crl.experiments.negatives.options import VERIFY_FILE
from crl.experiments.negatives.verify import VerifyPlan
from crl.experiments.results import read_results

OPTIONS: dict[str, Any] = dict(
    preset="smoke", workers=1, progress=False, group_runs=False, data="synthetic",
    ns=[128], fractions=[0.0625, 0.25, 0.5, 1.0], seeds=[0], batch_size=32,
    refine_runs=0, target_epochs=1.0, target_n=256, verify=True, verify_seeds=3, control=True)
PLAN = VerifyPlan("shared", 256, 32, (16, 32, 256), (0, 1, 2), "law")


def test_epochs_control_and_an_interrupted_verify_stage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the plan is fixed here (at this budget the curves are flat and nothing is recommended;
    # planning from recommendations is tests/experiments/test_negatives_verify.py)
    calls: list[int] = []

    def plan(recommendations: object, target_n: int, largest: int, seeds: tuple[int, ...],
             count: int) -> list[VerifyPlan]:
        calls.append(target_n)
        assert largest == 256 and seeds == (0,) and count == 3  # --verify-seeds reaches it
        return [PLAN]

    monkeypatch.setattr(verify_module, "plan_verify", plan)  # the study imports it at use
    real = NegativesStudy.execute

    def interrupted(self: NegativesStudy, spec: Any, run_dir: Path, *, resume: bool) -> None:
        if spec.tags.get("arm") == "verify" and spec.tags["m"] == 16:
            raise RuntimeError("killed")
        real(self, spec, run_dir, resume=resume)

    monkeypatch.setattr(NegativesStudy, "execute", interrupted)
    with pytest.raises(CrlValueError, match=r"3 of \d+ runs failed"):
        run_and_report("negatives", out=tmp_path, **OPTIONS)
    study_dir = tmp_path / "negatives"
    recorded = json.loads((study_dir / VERIFY_FILE).read_text())
    monkeypatch.setattr(NegativesStudy, "execute", real)
    _, analysis = run_and_report("negatives", out=tmp_path, **OPTIONS)  # the same call
    saved_plan = json.loads((study_dir / VERIFY_FILE).read_text())
    assert calls == [256] and not recorded["second_round_planned"]  # not replanned:
    assert [p["ms"] for p in saved_plan["plans"]] == [p["ms"] for p in recorded["plans"]]
    assert saved_plan["second_round_planned"]  # the second round followed the first, once
    [measured] = saved_plan["plans"]
    extra = measured["second_round"]
    assert extra == [] or (16 < min(extra) and max(extra) < 256)
    assert saved_plan["third_round_planned"]  # and the third, once, inside the bounds it had
    third = measured["third_round"]
    assert not set(third) & {16, 32, 256, *extra}
    second, extra = extra, extra + third
    rows = read_results(study_dir / "results.csv")
    verify = [r for r in rows if r.get("arm") == "verify"]
    assert len(verify) == 3 * (3 + len(extra)) and {int(r["n"]) for r in verify} == {256}
    for r in rows:  # every n trains one epoch, whatever the batch
        assert float(r["epoch"]) == pytest.approx(1.0)
    control = [r for r in rows if r.get("arm") == "control"]
    # per regime every m; m = n is one run serving both (8 rows, 7 runs)
    assert len(control) == 8 and {int(r["batch_size"]) for r in control} == {8}
    for r in control:
        assert float(r["negatives_per_step"]) == pytest.approx(8 * float(r["m"]) / 128)
    numbers = analysis.numbers
    assert numbers["budget"]["mode"] == "epochs" and numbers["budget"]["target_epochs"] == 1.0
    assert numbers["budget"]["samples_at_target"] == 256
    for rec in numbers["recommendations"].values():
        assert rec["budget"]["training"] == "1 epoch at every n"
    assert "trained for 1 epoch at every n" in analysis.headline
    [measured] = numbers["verify"]
    assert measured["m_rec"] == 32 and measured["measured_ms"] == sorted({16, 32, 256, *extra})
    assert measured["verdict"] in ("within", "not within",
                                   "within (the interval reaches past the tolerance)")
    assert second == [] or measured["verdict"] == "not within"
    assert measured["measured_m"] in measured["measured_ms"]
    # the answer to paste is the one measured at the target n, not the extrapolation
    pasted = numbers["fragments"]["shared"]
    rec = numbers["recommendations"]["shared"]
    assert rec["source"] == "verify stage" and rec["n_used"] == 256
    assert rec["prediction"]["source"] in ("law", "nearest cell")  # the grid's, kept beside
    assert measured["cell"]["n"] == 256 and measured["cell"]["m_star"] == rec["m"]
    value = rec["m"] if rec["m"] is not None else rec["low"] or rec["high"]
    assert pasted["m"] == max(1, round(value)) and pasted["source"] == "verify stage"
    assert pasted["negatives"] == {"regime": "shared", "m": pasted["m"]}
    assert f"m: {pasted['m']}" in analysis.closing
    assert rec["verify"] == measured
    assert (f"Verified at n = 256 (shared): the prediction m = 32 is {measured['verdict']}"
            in analysis.headline)
    [controls] = [s for s in analysis.sections if s.title.startswith("Control arm")]
    assert len(numbers["control"]) == 2 and "batch 8 against 32" in controls.paragraphs[1]
    saved = json.loads((study_dir / "analysis.json").read_text())["numbers"]
    assert saved["verify"] == numbers["verify"]
