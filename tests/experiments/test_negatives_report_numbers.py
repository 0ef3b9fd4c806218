"""Every number in the negatives report's words comes from ``analysis.json``: the committed
quick and full results (docs/results/negatives-*/results.csv) re-analysed, the headline and
every paragraph walked, each number matched to a value the analysis carries (or, in the set-up,
to the run config and data facts it quotes), to the precision it is printed at."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from crl.experiments.api import load_study
from crl.experiments.negatives.curves import LACK_OF_FIT_P
from crl.experiments.negatives.paper import PAPER
from crl.experiments.negatives.resample import MAX_EXACT
from crl.experiments.negatives.setup import DATA_FILE
from crl.experiments.negatives.theory import THEORY_FILE
from crl.experiments.negatives.verdict import NARROW, PREDICTED_ALPHA
from crl.experiments.results import read_results
from crl.experiments.study import Analysis

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"
#: Numbers that are part of the words, not measurements: 95% intervals, §7, m >= n - 1, the
#: exponents of the theory (1/2, 1, m^-k), the paper's fractions 10/40/100% and its figures,
#: the exact model's 2 x 6 table, and the rules' own thresholds.
CONSTANTS = {0.0, 0.5, 1.0, 2.0, 6.0, 7.0, 10.0, 40.0, 70.0, 100.0, 95.0, 2026.0, 14.0,
             LACK_OF_FIT_P, NARROW, float(MAX_EXACT), *PREDICTED_ALPHA.values(),
             *PAPER.gain_10_to_40_points, PAPER.gain_beyond_40_points, PAPER.saturation_fraction}
NUMBER = re.compile(r"(?<![\w.@])[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def _leaves(value: Any) -> list[float]:
    """Every number in a JSON value (strings excluded: sentences would match themselves)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)] if math.isfinite(value) else []
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return []


def _printed(token: str) -> tuple[float, float]:
    """The value of a printed number and half a unit of its last digit."""
    text = token.replace(",", "").lstrip("+")
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.partition(".")[2])
    scale = 10.0 ** int(exponent or 0)
    return abs(float(text)), 0.5 * 10.0 ** -decimals * scale * 1.001 + 1e-12


def _unmatched(sentence: str, pool: list[float]) -> list[str]:
    bad = []
    for token in NUMBER.findall(sentence):
        value, slack = _printed(token)
        if not any(abs(value - abs(v)) <= slack for v in pool):
            bad.append(token)
    return bad


@pytest.fixture(scope="module", params=["quick", "full", "quick-200k"])
def reanalysed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[Analysis, dict[str, Any], Path, list[dict[str, Any]]]:
    """The committed study's results re-analysed in a copy of its directory (the committed
    files are never touched); the exact-model cache is the full study's (same settings)."""
    source = DOCS / f"negatives-{request.param}"
    folder = tmp_path_factory.mktemp(request.param)
    for name in ("study.json", DATA_FILE, "refinement.json", "verify.json"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    theory = source / THEORY_FILE
    if not theory.exists():
        theory = DOCS / "negatives-full" / THEORY_FILE
    shutil.copy(theory, folder / THEORY_FILE)
    study = load_study(folder)
    study.load_state(folder)
    rows = read_results(source / "results.csv")
    analysis = study.analyze(rows, folder)
    numbers = json.loads(json.dumps(analysis.numbers, allow_nan=False))
    return analysis, numbers, folder, rows


def test_every_number_in_the_words_comes_from_the_analysis(
        reanalysed: tuple[Analysis, dict[str, Any], Path, list[dict[str, Any]]]) -> None:
    analysis, numbers, folder, rows = reanalysed
    pool = _leaves(numbers)
    pool += [100 * v for v in pool] + list(CONSTANTS)
    sentences = [analysis.headline] + [p for s in analysis.sections if s.title != "Set-up"
                                       for p in s.paragraphs]
    bad = {s[:80]: _unmatched(s, pool) for s in sentences if _unmatched(s, pool)}
    assert not bad, bad
    # the set-up quotes the run config and the data's facts
    study = load_study(folder)
    study.load_state(folder)
    setup = pool + _leaves(study.runs()[0].config) + _leaves(
        json.loads((folder / DATA_FILE).read_text())) + [float(len({r["run_id"] for r in rows}))]
    setup_section = next(s for s in analysis.sections if s.title == "Set-up")
    bad = {s[:80]: _unmatched(s, setup) for s in setup_section.paragraphs
           if _unmatched(s, setup)}
    assert not bad, bad


def test_the_set_up_counts_epochs_as_the_runs_do(
        reanalysed: tuple[Analysis, dict[str, Any], Path, list[dict[str, Any]]]) -> None:
    analysis, numbers, _, rows = reanalysed
    table = next(t for s in analysis.sections for t in s.tables if t.title.startswith(
        "The grid"))
    epochs_column = next(i for i, c in enumerate(table.columns) if c.startswith("epochs"))
    for row in table.rows:
        # The grid's runs: the control arm trains at another batch, so other epochs.
        runs = {float(r["epoch"]) for r in rows if int(r["n"]) == row[0]
                and r.get("arm") != "control"}
        assert runs and all(e == pytest.approx(row[epochs_column]) for e in runs), (row, runs)
        assert numbers["budget"]["epochs"][str(row[0])] == pytest.approx(row[epochs_column])


def test_the_report_drops_what_the_data_do_not_carry(
        reanalysed: tuple[Analysis, dict[str, Any], Path, list[dict[str, Any]]]) -> None:
    analysis, numbers, _, _ = reanalysed
    words = " ".join([analysis.headline] + [p for s in analysis.sections for p in s.paragraphs])
    assert "more anchors help more than more negatives" not in words
    assert "as the theory predicts" not in words and "neither confirm nor rule out" not in words
    assert f"within {numbers['tolerance']['text']} of the best" in analysis.headline
    for regime, rec in numbers["recommendations"].items():
        # measured at the target n where the verify stage ran, the grid's prediction kept
        predicted = rec["prediction"] if rec["source"] == "verify stage" else rec
        assert (rec["source"] == "verify stage") == (rec["verify"] is not None)
        assert predicted["source"] in ("law", "nearest cell")
        law = numbers["laws"][regime]
        if law["verdict"] == "does not fit":
            assert predicted["source"] == "nearest cell"
            assert f"{regime}: one power law does not describe these cells" in analysis.headline
    verdicts = {v["verdict"] for v in numbers["verdicts"].values()}
    assert verdicts <= {"consistent", "contradicted", "cannot tell"}
    assert set(numbers["verdicts"]) == {"shared", "independent", "shared - independent"}
    for cell in numbers["cells"]:
        assert cell["exact"]  # at most 7 seeds: every resample enumerated


def test_the_answer_to_paste_is_the_recommendation_and_its_numbers_are_the_analysis(
        reanalysed: tuple[Analysis, dict[str, Any], Path, list[dict[str, Any]]]) -> None:
    """The report's YAML blocks and the CLI's closing lines are the analysis's fragments: each
    regime's m (a censored cell's lower bound) with the runs' own loss, the in-batch batch size
    m + 1 of the shared answer; every number in their words comes from analysis.json."""
    analysis, numbers, folder, _ = reanalysed
    pool = _leaves(numbers)
    pool += [100 * v for v in pool] + list(CONSTANTS)
    section = next(s for s in analysis.sections if s.title == "The answer as a config")
    fragments, in_batch = numbers["fragments"], numbers["in_batch"]
    expected = [{k: f[k] for k in ("negatives", "loss")} for f in fragments.values()]
    expected += [{k: in_batch[k] for k in ("negatives", "loss", "train")}] if in_batch else []
    assert [yaml.safe_load(block) for block in section.code] == expected
    assert list(yaml.safe_load_all(analysis.closing)) == expected  # comments and documents
    study = load_study(folder)
    loss = study.runs()[0].config["loss"]
    for regime, fragment in fragments.items():
        rec = numbers["recommendations"][regime]
        value = rec["m"] if rec["m"] is not None else rec["low"] or rec["high"]
        assert fragment["negatives"] == {"regime": regime, "m": max(1, round(value))}
        assert fragment["loss"]["name"] == loss["name"]
        assert fragment["loss"]["temperature"] == loss["temperature"]
    assert set(fragments) == set(numbers["recommendations"])  # every regime gives an m here
    assert in_batch["batch_size"] == fragments["shared"]["m"] + 1
    assert in_batch["train"]["batch_size"] == in_batch["batch_size"]
    assert in_batch["memory"]["cached"] == 16 * in_batch["batch_size"] * in_batch["memory"]["dim"]
    words = section.paragraphs + [line[2:] for line in analysis.closing.splitlines()
                                  if line.startswith("# ")]
    words += [line for block in section.code for line in block.splitlines()]
    bad = {s[:80]: _unmatched(s, pool) for s in words if _unmatched(s, pool)}
    assert not bad, bad


def test_the_headline_states_each_m_as_the_table_does(
        reanalysed: tuple[Analysis, dict[str, Any], Path, list[dict[str, Any]]]) -> None:
    """One convention for m: a count of negatives per anchor with its % of the n it is for,
    the same in the headline, the recommendation table and analysis.json."""
    analysis, numbers, _, _ = reanalysed
    table = next(t for s in analysis.sections for t in s.tables
                 if t.title.startswith("The recommendation per regime"))
    by_regime = {row[0]: row for row in table.rows}
    for regime, rec in numbers["recommendations"].items():
        if rec["m"] is None:
            continue
        found = re.search(rf"{regime}: [^;]*; use m ≈ ([\d,]+) \(([\d.]+)% of n\) at n = "
                          r"([\d,]+)", analysis.headline)
        assert found, (regime, analysis.headline)
        m, percent, n = (float(g.replace(",", "")) for g in found.groups())
        assert m == round(rec["m"]) and n == rec["target_n"] == by_regime[regime][1]
        assert by_regime[regime][3] == f"{rec['m']:,.0f}"
        assert percent == pytest.approx(100 * rec["m"] / rec["target_n"], rel=5e-3)
    assert "m*/n ranges over" not in " ".join(p for s in analysis.sections for p in s.paragraphs)
