"""What a study reads, checked (issue 27, rows 8 to 11): every option of ``crl study negatives``
before any run trains, ``study.json`` when ``crl report`` reads it, finished runs whose results
cannot be read (listed in the report and counted against "finished", never dropped without a
word), and ``results.csv`` cells a spreadsheet would run as formulas (neutralised, read back
exactly, the committed results unchanged)."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from crl.cli import app
from crl.errors import CrlValueError
from crl.experiments.api import load_study
from crl.experiments.negatives import NegativesStudy
from crl.experiments.negatives.curves import curve_cells
from crl.experiments.negatives.tolerance import Tolerance
from crl.experiments.results import csv_cell, read_results, write_results

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"
#: A study of 6 distinct runs of 4 steps each (n = 64 and 128; m = 25% in both regimes, 100%).
TINY = ["study", "negatives", "--preset", "smoke", "--data", "synthetic", "--ns", "64,128",
        "--fractions", "0.25,1", "--seeds", "0", "--budget", "128", "--batch-size", "32",
        "--refine-runs", "0", "--workers", "1", "--no-progress"]
X2Y = "retrieval/x2y_recall@1"


def _invoke(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    monkeypatch.setenv("CRL_DEBUG", "0")
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


# ----------------------------------------------------------------------------- row 8: options

TOLERANCE = ("`--tolerance`: must be a number of points of the metric >= 0 (e.g. 0.01) or a "
             "percentage of the best below 100% (e.g. 2%); got ")
BAD_OPTIONS = [
    (["--tolerance", "-1"], TOLERANCE + "'-1'"),
    (["--tolerance", "nan"], TOLERANCE + "'nan'"),
    (["--tolerance", "inf"], TOLERANCE + "'inf'"),
    (["--tolerance", "2 points"], TOLERANCE + "'2 points'"),
    (["--tolerance", "100%"], TOLERANCE + "'100%'"),
    (["--temperature", "0"], "`--temperature`: input should be greater than 0; got 0.0"),
    (["--temperature", "nan"], "`--temperature`: input should be a finite number"),
    (["--ns", "1"], "`--ns` must be integers >= 2; got [1]"),
    (["--fractions", "nan"], "`--fractions` (m/n) must lie in (0, 1]; got [nan]"),
    (["--seeds", "-1"], "`--seeds` must be integers >= 0"),
    (["--budget", "0"], "`--budget` must be an integer >= 1; got 0"),
    (["--batch-size", "1"], "`--batch-size` must be an integer >= 2; got 1"),
    (["--refine-runs", "-1"], "`--refine-runs` must be an integer >= 0; got -1"),
    (["--target-n", "1"], "`--target-n` must be an integer >= 2; got 1"),
    (["--device", "tpu"], "`--device`: must be cpu, cuda or cuda:N; got 'tpu'"),
    (["--model", "resnet"], "`--model`: input should be 'auto', 'linear'"),
    (["--metric", "accuracy"], "`--metric`: has no declared direction; choose one of"),
    (["--config", "missing.yaml"], "`--config`: load_config: CONFIG must be a YAML file"),
    (["--config", "synthetic-gaussian", "--data", "synthetic"],
     "give `--data` or `--config`, not both"),
    (["--config", "synthetic-gaussian", "--model", "mlp"], "give `--model` or `--config`"),
    (["--data", "pairs.xlsx"], "`--data` must be one of"),
    (["--workers", "0"], "--workers must be an integer >= 1; got 0"),
    (["--preset", "huge"], "unknown preset 'huge'"),
]


@pytest.mark.parametrize(("extra", "words"), BAD_OPTIONS,
                         ids=[" ".join(extra) for extra, _ in BAD_OPTIONS])
def test_every_study_option_is_checked_before_anything_is_written(
        extra: list[str], words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = TINY
    if "--config" in extra:  # the config names its data: no --data beside it (but where tested)
        at = TINY.index("--data")
        base = TINY[:at] + TINY[at + 2:]
    code, _, stderr = _invoke([*base, *extra, "--out", str(tmp_path / "runs")], monkeypatch)
    assert code == 2
    assert words in _one_line(stderr)
    assert not (tmp_path / "runs").exists()  # no study directory, so no run trained


def test_the_tolerance_is_points_or_a_percentage_and_anything_else_is_one_line() -> None:
    rows = [{"regime": "shared", "n": 8, "m": m, "seed": 0, "recall@1": 0.1 * m} for m in (2, 4)]
    assert curve_cells(rows, "recall@1", True, Tolerance(0.0))  # zero: the top itself
    assert NegativesStudy("smoke", data="synthetic", tolerance="2%").tolerance == \
        Tolerance(0.02, relative=True)
    for bad in (-1.0, math.nan, math.inf, True, "abc", "150%"):
        with pytest.raises(CrlValueError, match="`--tolerance`: must be a number") as caught:
            NegativesStudy("smoke", data="synthetic", tolerance=bad)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value)


def test_options_are_recorded_as_before(tmp_path: Path) -> None:
    """study.json keeps its form (data, metric and tolerance always; the rest when given), so
    the studies already on disk are the same studies."""
    assert NegativesStudy("smoke", data="synthetic").describe() == {
        "study": "negatives", "preset": "smoke",
        "options": {"data": "synthetic", "metric": None, "tolerance": 0.01}}
    study = NegativesStudy("smoke", data="synthetic", ns=(64, 128), tolerance=0.02, seeds=[1])
    assert study.options == {"data": "synthetic", "metric": None, "tolerance": 0.02,
                             "ns": [64, 128], "seeds": [1]}
    assert NegativesStudy("smoke", **study.options).options == study.options
    # the committed quick study ran with --verify (optional in quick)
    assert json.loads((DOCS / "negatives-quick" / "study.json").read_text())["options"] == \
        NegativesStudy("quick", verify=True).options


# ----------------------------------------------------------------------------- row 9: study.json


def _study_dir(tmp_path: Path, described: dict[str, object]) -> Path:
    study_dir = tmp_path / "negatives"
    study_dir.mkdir()
    (study_dir / "study.json").write_text(json.dumps(described))
    return study_dir


BAD_FILES = [
    ({"options": {"data": "synthetic", "tolerance": "x"}},
     "options.tolerance: must be a number of points of the metric >= 0 (e.g. 0.01) or a "
     "percentage of the best below 100% (e.g. 2%); got 'x'"),
    ({"options": {"data": "synthetic", "tolerance": -1}},
     "options.tolerance: must be a number of points of the metric >= 0 (e.g. 0.01) or a "
     "percentage of the best below 100% (e.g. 2%); got -1"),
    ({"options": {"data": "synthetic", "tolerence": 0.01}},
     "options.tolerence: unknown option; valid options: data, config, model, metric, tolerance"),
    ({"options": {"data": "synthetic", "ns": [64, "128"]}},
     "options.ns[1]: input should be a valid integer; got '128'"),
    ({"options": {"data": "synthetic", "ns": [1]}}, "study negatives: `--ns` must be integers"),
    ({"options": {"data": "synthetic"}, "colour": "red"},
     "colour: unknown key; valid keys: study, preset, options"),
    ({"preset": "huge"}, "preset: input should be 'smoke', 'quick' or 'full'; got 'huge'"),
    ({"study": "negative"}, "study: crl study: unknown study 'negative'"),
    ({"options": [1]}, "options: input should be a valid dictionary; got [1]"),
]


@pytest.mark.parametrize(("change", "words"), BAD_FILES, ids=[w[:30] for _, w in BAD_FILES])
def test_crl_report_checks_every_key_of_study_json(
        change: dict[str, object], words: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    study_dir = _study_dir(tmp_path, {"study": "negatives", "preset": "smoke",
                                      "options": {"data": "synthetic"}, **change})
    before = sorted(p.name for p in study_dir.iterdir())
    code, _, stderr = _invoke(["report", str(study_dir)], monkeypatch)
    assert code == 2
    line = _one_line(stderr)
    assert f"{study_dir / 'study.json'}: " in line and words in line, line
    assert sorted(p.name for p in study_dir.iterdir()) == before
    with pytest.raises(CrlValueError, match=r"study\.json: "):
        load_study(study_dir)


# ----------------------------------------------------------------------------- rows 10, 11: rows


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny study (6 distinct runs)."""
    out = tmp_path_factory.mktemp("study")
    result = CliRunner().invoke(app, [*TINY, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out / "negatives"


def _copy(study_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(study_dir, tmp_path / "negatives"))


def _edit_summary(run: Path, **values: object) -> None:
    path = run / "summary.json"
    summary = json.loads(path.read_text())
    summary.update(values)
    path.write_text(json.dumps(summary))  # NaN is written as the token NaN, read back as nan


def _runs(study_dir: Path) -> list[Path]:
    return sorted(p.parent for p in study_dir.glob("*/summary.json"))


@pytest.mark.parametrize(("value", "shown"), [("abc", "'abc'"), (math.nan, "nan"),
                                              (None, "None"), (True, "True")])
def test_a_run_whose_metric_cannot_be_read_is_listed_and_counts_against_finished(
        finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: object,
        shown: str) -> None:
    study_dir = _copy(finished, tmp_path)
    run = _runs(study_dir)[1]
    _edit_summary(run, **{X2Y: value})
    code, _, stderr = _invoke(["report", str(study_dir)], monkeypatch)
    assert code == 0, stderr
    entry = f"{run.name}: {X2Y} = {shown}"
    assert stderr.startswith("warning: 1 finished run cannot be read") and entry in stderr
    page = (study_dir / "report.html").read_text()
    assert "Distinct runs finished: 5 of 6." in page
    assert "1 finished run cannot be read and is left out of the analysis" in page
    assert f"<td>{run.name}</td><td>{X2Y}</td>" in page
    analysis = json.loads((study_dir / "analysis.json").read_text())
    assert analysis["unreadable"] == [{"run_id": run.name, "key": X2Y, "value": shown}]
    assert analysis["numbers"]["critical_m"]["dropped_rows"] == 0  # left out before the fit
    assert run.name in {r["run_id"] for r in read_results(study_dir / "results.csv")}


def test_a_summary_that_is_not_json_or_lacks_the_metric_is_listed(
        finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study_dir = _copy(finished, tmp_path)
    first, second = _runs(study_dir)[:2]
    (first / "summary.json").write_text('{"step": 4, "retrieval/x2y_rec')
    summary = json.loads((second / "summary.json").read_text())
    del summary["retrieval/y2x_recall@1"]
    (second / "summary.json").write_text(json.dumps(summary))
    code, _, stderr = _invoke(["report", str(study_dir)], monkeypatch)
    assert code == 0, stderr
    assert "warning: 2 finished runs cannot be read" in stderr
    assert f"{first.name}/summary.json: not valid JSON" in stderr
    assert f"{second.name}: retrieval/y2x_recall@1 = missing" in stderr
    assert "Distinct runs finished: 4 of 6." in (study_dir / "report.html").read_text()


def test_when_no_finished_run_can_be_read_the_report_fails_saying_why(
        finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study_dir = _copy(finished, tmp_path)
    for run in _runs(study_dir):
        _edit_summary(run, **{X2Y: "abc"})
    code, _, stderr = _invoke(["report", str(study_dir)], monkeypatch)
    assert code == 2
    line = _one_line(stderr)
    assert "no finished run can be read; 6 finished runs cannot be read" in line


FORMULAS = {"=1+2": "'=1+2", "+SUM(A1)": "'+SUM(A1)", "-2+3": "'-2+3", "@SUM(1)": "'@SUM(1)",
            "\t=1": "'\t=1", "\r=1": "'\r=1", "'=1": "''=1", "-0.5": "-0.5", "+1e-3": "+1e-3",
            "shared": "shared", "'quoted'": "'quoted'", "a=b": "a=b", "": ""}


def test_csv_cells_that_a_spreadsheet_would_run_are_neutralised_and_read_back(
        tmp_path: Path) -> None:
    assert {text: csv_cell(text) for text in FORMULAS} == FORMULAS
    assert csv_cell(-0.5) == -0.5 and csv_cell(math.inf) == "nan" and csv_cell(3) == 3
    # (strings that are numbers, such as "-0.5", are read back as numbers: left out here)
    rows = [{"run_id": "r0", '=HYPERLINK("x")': text, "loss": -0.5, "-1": 1}
            for text in FORMULAS if text not in ("-0.5", "+1e-3")]
    path = tmp_path / "results.csv"
    write_results(rows, path, ["run_id"])
    with open(path, newline="", encoding="utf-8") as handle:
        table = list(csv.reader(handle))
    assert table[0] == ["run_id", "-1", "'=HYPERLINK(\"x\")", "loss"]
    assert not [cell for row in table for cell in row if _formula(cell)]
    assert {(row[1], row[3]) for row in table[1:]} == {("1", "-0.5")}
    back = read_results(path)
    assert [r['=HYPERLINK("x")'] for r in back] == [r['=HYPERLINK("x")'] or None for r in rows]
    assert {(r["-1"], r["loss"]) for r in back} == {(1, -0.5)}


def _formula(cell: str) -> bool:
    """What a spreadsheet would run: a cell starting with = + - @ tab or CR, not a number."""
    try:
        float(cell)
        return False
    except ValueError:
        return cell.startswith(("=", "+", "-", "@", "\t", "\r"))


def test_a_summary_key_or_value_starting_with_a_formula_is_neutralised_in_results_csv(
        finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study_dir = _copy(finished, tmp_path)
    first, second = _runs(study_dir)[:2]
    _edit_summary(first, **{"=cmd|' /C calc'!A0": "=1+2", "note": "@SUM(1)"})
    _edit_summary(second, **{X2Y: "=2+3"})  # a metric: also unreadable
    code, _, stderr = _invoke(["report", str(study_dir)], monkeypatch)
    assert code == 0, stderr
    text = (study_dir / "results.csv").read_text(encoding="utf-8")
    table = list(csv.reader(io.StringIO(text)))
    cells = [cell for row in table for cell in row]
    assert "'=cmd|' /C calc'!A0" in table[0] and "'=1+2" in cells and "'@SUM(1)" in cells
    assert "'=2+3" in cells
    assert not [cell for cell in cells if _formula(cell)]
    back = {r["run_id"]: r for r in read_results(study_dir / "results.csv")}
    assert back[first.name]["=cmd|' /C calc'!A0"] == "=1+2"
    assert back[second.name][X2Y] == "=2+3"
    assert f"{second.name}: {X2Y} = '=2+3'" in stderr


@pytest.mark.parametrize("name", ["negatives-quick", "negatives-full"])
def test_the_committed_results_are_written_byte_for_byte_as_before(
        name: str, tmp_path: Path) -> None:
    """Their cells are numbers and plain words: read back and written again they are the same
    bytes (so ``crl report`` on their run directories rebuilds the same file)."""
    committed = DOCS / name / "results.csv"
    header = committed.read_text(encoding="utf-8").split("\n", 1)[0].split(",")
    again = tmp_path / "results.csv"
    write_results(read_results(committed), again, header)
    assert again.read_bytes() == committed.read_bytes()
