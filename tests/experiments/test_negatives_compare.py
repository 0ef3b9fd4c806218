"""``crl study compare``: two negatives studies agree when they answer the same question (data,
metric, tolerance, target n, training) and each recommendation lies in the other's interval;
otherwise it says why not, with the numbers."""

from __future__ import annotations

import copy
import json
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


def test_the_verify_stages_answers_are_compared_too(tmp_path: Path) -> None:
    def verified(measured: int, below: int | None) -> dict[str, Any]:
        rec = _rec(600, 400, 800)
        rec["verify"] = {"target_n": 17_908, "m_rec": 600, "verdict": "not within",
                         "best_m": 4000, "measured_m": measured, "below_m": below}
        return rec

    a = _study(tmp_path / "a", _numbers(verified(2000, 1400), verified(1400, 1000)))
    b = _study(tmp_path / "b", _numbers(verified(1700, 1200), verified(2800, 2000)))
    by = {r.regime: r for r in compare_studies(a, b).regimes}
    assert by["shared"].measured.endswith(": agree")  # (1,400, 2,000] and (1,200, 1,700]
    assert by["independent"].measured.endswith(": disagree")  # (1,000, 1,400], (2,000, 2,800]
    assert "A m = 1,400 (above 1,000), B m = 2,800 (above 2,000)" in by["independent"].measured
    assert compare_studies(a, a).regimes[0].measured.endswith("agree")
    assert compare_studies(a, b).measured_agree is False
    # the grids' recommendations (600 [400, 800] twice) agree; measured at the target n too
    assert compare_studies(a, a).measured_agree is True
    c = _study(tmp_path / "d", _numbers(verified(1700, 1200), verified(1300, 900)))
    for regime in ("shared", "independent"):  # the grids now disagree, the measurements not
        json_path = c / "analysis.json"
        numbers = json.loads(json_path.read_text())
        numbers["numbers"]["recommendations"][regime].update(m=5000, low=4000, high=6000)
        json_path.write_text(json.dumps(numbers))
    both = compare_studies(a, c)
    assert not both.agree and both.measured_agree is True
    assert both.verdict().startswith("do not agree on the grids' recommendations; the answers "
                                     "measured at the target n")
    cli = runner.invoke(app, ["study", "compare", str(a), str(c)])
    assert cli.exit_code == 0 and "(the configs to paste) agree" in cli.output, cli.output
    unmeasured = _study(tmp_path / "c", _numbers(_rec(600, 400, 800), _rec(600, 400, 800)))
    assert all(r.measured == "" for r in compare_studies(a, unmeasured).regimes)


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
