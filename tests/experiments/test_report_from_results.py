"""``crl report DIR --from-results``: a study directory whose run directories are gone (the
committed docs/results/) is re-analysed from its results.csv, which is kept byte for byte."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from crl.cli import app

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"
runner = CliRunner()


def test_a_committed_study_is_rebuilt_from_its_results_csv(tmp_path: Path) -> None:
    study_dir = tmp_path / "quick"
    shutil.copytree(DOCS / "negatives-quick", study_dir)
    (study_dir / "analysis.json").unlink()
    (study_dir / "report.html").unlink()
    before = (study_dir / "results.csv").read_bytes()
    result = runner.invoke(app, ["report", str(study_dir), "--from-results"])
    assert result.exit_code == 0, result.output
    assert (study_dir / "results.csv").read_bytes() == before
    saved = json.loads((study_dir / "analysis.json").read_text())
    committed = json.loads((DOCS / "negatives-quick" / "analysis.json").read_text())
    assert saved["compute"] == committed["compute"]  # the same rows, the same totals
    assert saved["numbers"]["recommendations"].keys() == {"shared", "independent"}
    page = (study_dir / "report.html").read_text()
    assert "rebuilt from results.csv by" in page and "--from-results" in page


def test_without_a_results_csv_it_says_so_in_one_line(tmp_path: Path) -> None:
    study_dir = tmp_path / "bare"
    study_dir.mkdir()
    shutil.copy(DOCS / "negatives-quick" / "study.json", study_dir / "study.json")
    result = runner.invoke(app, ["report", str(study_dir), "--from-results"])
    assert result.exit_code == 2
    assert "--from-results reads" in result.output and "does not exist" in result.output
    assert "Traceback" not in result.output
