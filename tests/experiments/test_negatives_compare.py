"""``crl study compare``: two negatives studies agree when they answer the same question (data,
metric, tolerance, target n, training) and each recommendation lies in the other's interval;
otherwise it says why not, with the numbers."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from crl.cli import app
from crl.experiments.negatives.compare import compare_studies

runner = CliRunner()


def _rec(m: float | None, low: float, high: float | None, *, source: str = "law",
         n_used: int = 17_908) -> dict[str, Any]:
    return {"m": m, "low": low, "high": high, "source": source, "n_used": n_used,
            "extrapolation": False, "target_n": 17_908, "verify": None}


def _numbers(shared: dict[str, Any], independent: dict[str, Any], *,
             samples: int = 200_000) -> dict[str, Any]:
    return {"metric": "recall@1", "tolerance": {"text": "0.01", "value": 0.01},
            "target_n": 17_908,
            "budget": {"mode": "samples", "samples_per_run": samples, "batch_size": 256,
                       "target_epochs": None},
            "recommendations": {"shared": shared, "independent": independent}}


def _study(path: Path, numbers: dict[str, Any], preset: str = "quick") -> Path:
    path.mkdir(parents=True)
    (path / "study.json").write_text(json.dumps(
        {"study": "negatives", "preset": preset, "options": {"data": "pycode"}}))
    (path / "analysis.json").write_text(json.dumps({"headline": "", "numbers": numbers}))
    return path


def test_agree_disagree_and_why(tmp_path: Path) -> None:
    a = _study(tmp_path / "a", _numbers(_rec(3000, 2500, 4000), _rec(1500, 1000, 2000)))
    b_numbers = _numbers(_rec(3500, 2800, 5000), _rec(600, 400, 800, source="nearest cell",
                                                      n_used=15_000))
    b_numbers["recommendations"]["independent"]["verify"] = {
        "target_n": 17_908, "m_rec": 600, "verdict": "not within", "best_m": 1200}
    b = _study(tmp_path / "b", b_numbers, preset="full")
    result = compare_studies(a, b)
    assert not result.mismatches and not result.agree
    verdicts = {r.regime: r for r in result.regimes}
    assert verdicts["shared"].verdict == "agree"  # 3000 in [2800, 5000], 3500 in [2500, 4000]
    independent = verdicts["independent"]
    assert independent.verdict == "disagree"
    assert "nearest cell at n = 15,000" in independent.why and "not within" in independent.why
    lines = result.lines()
    assert any(line.startswith("shared: agree: A m = 3,000 [2,500, 4,000]") for line in lines)
    cli = runner.invoke(app, ["study", "compare", str(a), str(b)])
    assert cli.exit_code == 0, cli.output
    assert "independent: disagree" in cli.output and cli.output.strip().endswith("do not agree")


def test_measured_recommendations_are_compared_and_their_predictions_too(tmp_path: Path
                                                                         ) -> None:
    """A study whose verify stage ran recommends what it measured at the target n, with the
    grid's prediction kept beside it: the recommendations decide the verdict, the predictions
    are compared by the same rule and named in the closing line."""
    def measured(m: float | None, low: float, high: float, predicted: float) -> dict[str, Any]:
        rec = _rec(m, low, high, source="verify stage")
        rec["prediction"] = _rec(predicted, 0.8 * predicted, 1.25 * predicted)
        return rec

    a = _study(tmp_path / "a", _numbers(measured(6500, 6200, 6900, 6500),
                                        measured(None, 4200, 17_908, 114)))
    b = _study(tmp_path / "b", _numbers(measured(6900, 6400, 17_908, 3700),
                                        measured(6000, 5200, 6900, 3600)))
    result = compare_studies(a, b)
    by = {r.regime: r for r in result.regimes}
    assert by["shared"].verdict == "agree"  # 6,500 in [6,400, 17,908], 6,900 in [6,200, 6,900]
    assert by["independent"].verdict == "agree"  # A gives bounds [4,200, 17,908] holding 6,000
    assert by["independent"].why == "A gives only bounds, and the other's m lies within them"
    assert by["shared"].predictions_agree is False  # 6,500 [5,200, 8,125] against 3,700 [...]
    assert "the grids' predictions: A m = 6,500 [5,200, 8,125], B m = 3,700" in \
        by["shared"].predicted
    assert result.agree and result.predictions_agree is False
    assert result.verdict() == ("agree; the grids' predictions at the target n, before the "
                                "verify stages measured it, do not agree")
    assert compare_studies(b, b).verdict() == ("agree; the grids' predictions at the target n "
                                               "agree too")
    assert compare_studies(a, a).verdict().startswith("do not agree")  # bounds against bounds
    cli = runner.invoke(app, ["study", "compare", str(a), str(b)])
    assert cli.exit_code == 0, cli.output
    assert "measured it, do not agree" in cli.output and "shared: agree" in cli.output
    far = _study(tmp_path / "c", _numbers(measured(2000, 1500, 2500, 2000),
                                          measured(1000, 800, 1200, 1000)))
    apart = compare_studies(a, far)
    assert not apart.agree and apart.verdict().startswith("do not agree")
    assert "the verify stage's runs at n = 17,908" in apart.regimes[1].why
    overlapping = _study(tmp_path / "f", _numbers(measured(6500, 6200, 6900, 6500),
                                                  measured(4700, 4250, 5250, 114)))
    [independent] = [r for r in compare_studies(overlapping, b).regimes
                     if r.regime == "independent"]  # 4,700 [4,250, 5,250] and 6,000 [5,200, ...]
    assert independent.verdict == "disagree"
    assert "the intervals overlap on [5,200, 5,250], but neither m lies in the other's" in \
        independent.why
    one_way = _study(tmp_path / "g", _numbers(measured(6500, 6200, 6900, 6500),
                                              measured(5500, 5300, 5800, 114)))
    [independent] = [r for r in compare_studies(one_way, b).regimes
                     if r.regime == "independent"]  # 5,500 in [5,200, 6,900]; 6,000 not in A's
    assert independent.verdict == "disagree"
    assert "the intervals overlap on [5,300, 5,800], but only A's m lies in the other's" in \
        independent.why
    unmeasured = _study(tmp_path / "d", _numbers(_rec(600, 400, 800), _rec(600, 400, 800)))
    mixed = compare_studies(a, unmeasured)
    assert all(r.predicted == "" for r in mixed.regimes) and mixed.predictions_agree is None
    assert compare_studies(unmeasured, unmeasured).verdict() == "agree"
    both_bounds = _study(tmp_path / "e", _numbers(measured(None, 100, 900, 100),
                                                  measured(None, 100, 900, 100)))
    assert {r.verdict for r in compare_studies(both_bounds, both_bounds).regimes} == {
        "cannot tell"}


def test_different_questions_are_not_compared(tmp_path: Path) -> None:
    base = _numbers(_rec(3000, 2500, 4000), _rec(1500, 1000, 2000))
    a = _study(tmp_path / "a", base)
    other = copy.deepcopy(base)
    other["budget"]["samples_per_run"] = 12_000
    other["tolerance"]["text"] = "2% of the best"
    b = _study(tmp_path / "b", other)
    result = compare_studies(a, b)
    assert not result.agree and not result.regimes
    line = result.lines()[0]
    assert line.startswith("not comparable") and "2% of the best" in line
    assert "training: 200,000 samples per run at batch 256 against 12,000 samples" in line
    same = compare_studies(a, _study(tmp_path / "c", copy.deepcopy(base)))
    assert same.agree and [r.verdict for r in same.regimes] == ["agree", "agree"]


def test_a_directory_that_is_not_a_negatives_study_is_one_line(tmp_path: Path) -> None:
    a = _study(tmp_path / "a", _numbers(_rec(1, 0, 2), _rec(1, 0, 2)))
    result = runner.invoke(app, ["study", "compare", str(a), str(tmp_path / "missing")])
    assert result.exit_code == 2 and "has no study.json" in result.output


def _verify_rows(ms: list[int], curve: Any, seeds: range) -> list[dict[str, Any]]:
    """Verify-stage rows at n = 17,908 for both regimes: recall@1 = curve(m) + a seed level +
    noise fixed by (m, seed), so that the same run scores the same in both studies."""
    def score(m: int, s: int) -> float:
        return float(curve(m) + 0.002 * s + 0.001 * math.sin(7.0 * m + 3.0 * s))
    return [{"run_id": f"{regime}-{m}-{s}", "n": 17_908, "m": m, "regime": regime, "seed": s,
             "arm": "verify", "retrieval/x2y_recall@1": score(m, s),
             "retrieval/y2x_recall@1": score(m, s)}
            for regime in ("shared", "independent") for m in ms for s in seeds]


def test_two_verify_stages_are_read_as_one_sample(tmp_path: Path) -> None:
    """Both verify stages trained the same seeds at the same target n: their runs are pooled
    into one cell per regime (the runs both trained must score the same), and the comparison
    says whether that reading holds each study's m."""
    from crl.experiments.results import write_results

    def curve(m: int) -> float:  # rises in log m up to 5,000, flat after
        return 0.40 - 0.04 * max(0.0, math.log(5000 / m)) / math.log(5000 / 500)

    def measured(m: float, low: float, high: float) -> dict[str, Any]:
        return _rec(m, low, high, source="verify stage")

    a = _study(tmp_path / "a", _numbers(measured(3000, 2800, 3300), measured(3000, 2800, 3300)))
    b = _study(tmp_path / "b", _numbers(measured(3900, 3600, 4200), measured(3900, 3600, 4200)))
    ms_a, ms_b = [500, 1000, 2000, 8000, 17_908], [1500, 2500, 3500, 4500, 17_908]
    write_results(_verify_rows(ms_a, curve, range(3)), a / "results.csv", ["run_id"])
    write_results(_verify_rows(ms_b, curve, range(3)), b / "results.csv", ["run_id"])
    result = compare_studies(a, b)
    for r in result.regimes:
        assert r.verdict == "disagree"  # 3,000 and 3,900: neither in the other's interval
        assert r.pooled.startswith("both verify stages' runs read as one cell (9 m, 3 seeds; "
                                   "the 3 runs both trained score the same in each): m* = ")
        # planted m*: within 0.01 of the plateau at 5000 * (500 / 5000) ** (1 / 4) = 2,812
        found = re.search(r"m\* = ([\d,]+) \[([\d,]+), ([\d,]+)\], which holds A's m only$",
                          r.pooled)
        assert found, r.pooled
        point, low, high = (float(g.replace(",", "")) for g in found.groups())
        assert low <= 5000 * 0.1 ** 0.25 <= high and low <= point <= high and high < 3600
    assert "runs read as one cell" in result.lines()[0]
    far = _study(tmp_path / "c", _numbers(measured(9000, 8000, 9900), measured(9000, 8000, 9900)))
    write_results(_verify_rows(ms_a, curve, range(3)), far / "results.csv", ["run_id"])
    assert all(r.pooled.endswith("which holds neither m") for r in compare_studies(far, b).regimes)
    rows = _verify_rows(ms_b, curve, range(3))
    rows[-1]["retrieval/x2y_recall@1"] += 0.01  # a run both trained, scored differently
    (b / "results.csv").unlink()
    write_results(rows, b / "results.csv", ["run_id"])
    apart = compare_studies(a, b)
    assert all(r.pooled == "not pooled: 1 of the 6 runs both studies trained at the target n "
               "score differently: they are not one sample" for r in apart.regimes)
    (b / "results.csv").unlink()
    assert all(r.pooled == "not pooled: a study directory has no results.csv"
               for r in compare_studies(a, b).regimes)


def test_the_committed_quick_and_full_presets_agree_at_the_same_budget() -> None:
    """docs/results/negatives-quick-200k (the quick grid at the full preset's budget) and
    docs/results/negatives-full: measured at the target n, each regime's m within the other's
    interval; the runs both verify stages trained, read as one cell, hold both m."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "results"
    result = compare_studies(docs / "negatives-quick-200k", docs / "negatives-full")
    assert not result.mismatches
    assert {r.regime: r.verdict for r in result.regimes} == {"shared": "agree",
                                                             "independent": "agree"}
    for r in result.regimes:
        assert r.pooled.endswith("which holds both m"), r.pooled
        for (m, low, high), (other, _, _) in ((r.a, r.b), (r.b, r.a)):
            assert m is not None and other is not None and low <= other <= high
