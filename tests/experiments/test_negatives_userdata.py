"""The user's data as the negatives study sees it: ``--target-n`` defaults to the training pairs
the user's own ``crl train`` uses (their config's split and ``data.num_train``; crl train's
default split of a file given with ``--data``), and a preset's n span is fitted to a file with
fewer pairs than it needs, with the numbers said (crl.experiments.negatives.userdata)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from crl.data import DataConfig, load_data
from crl.errors import CrlValueError
from crl.experiments.negatives import NegativesStudy
from crl.experiments.negatives.grid import GRIDS
from crl.experiments.negatives.userdata import fit_span, span_text, user_training


def _pairs(path: Path, count: int) -> Path:
    with open(path, "w") as handle:
        for i in range(count):
            handle.write(json.dumps({"a": f"sort {i} items", "b": f"def f{i}(): return {i}"})
                         + "\n")
    return path


def test_a_config_trains_on_its_own_split_capped_by_its_num_train(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"data": {"name": "synthetic", "num_train": 700,
                                               "synthetic": {"num_samples": 2000}},
                                      "model": {"kind": "mlp", "embed_dim": 8},
                                      "loss": {"name": "gcl"}}))
    study = NegativesStudy("smoke", config=str(config), ns=[64, 128], seeds=[0])
    study.check(tmp_path / "study")
    facts = json.loads((tmp_path / "study" / "data.json").read_text())
    # the study's runs keep the config's split (10% validation, 20% test of 2,000)
    assert facts["train_size"] == 1400 and facts["user_train_size"] == 700
    assert study._target(tmp_path / "study") == 700
    assert "data.num_train" in facts["target_source"]
    assert NegativesStudy("smoke", config=str(config), ns=[64], seeds=[0], target_n=300
                          )._target(tmp_path / "study") == 300  # --target-n wins


def test_a_file_without_a_config_is_crl_trains_default_split(tmp_path: Path) -> None:
    data = _pairs(tmp_path / "pairs.jsonl", 500)
    run_data = {"name": "files", "files": {"path": str(data)}, "val_fraction": 0.0,
                "num_train": 64, "seed": 0}
    found = user_training({"data": run_data}, None, "files", 400)
    by_hand = len(load_data(DataConfig.model_validate(
        {"name": "files", "files": {"path": str(data)}}), progress=False).train)
    assert found["user_train_size"] == by_hand == 500 - 100 - 50
    assert "10% validation, 20% test" in found["target_source"]
    built_in = user_training({"data": {"name": "pycode"}}, None, "pycode", 17_908)
    assert built_in["user_train_size"] == 17_908


def test_the_span_is_scaled_to_a_small_file_and_said() -> None:
    quick = GRIDS["files"]["quick"].ns
    assert fit_span(quick, max(quick)) is None
    fitted = fit_span(quick, 1200)
    assert fitted is not None and max(fitted) == 1200 and len(fitted) == len(quick)
    assert [round(n / fitted[0], 1) for n in fitted] == [round(n / quick[0], 1) for n in quick]
    words = span_text("quick", quick, fitted, 1200)
    assert f"need {max(quick):,} training pairs" in words and "holds 1,200" in words
    with pytest.raises(CrlValueError, match="too few for a span of n"):
        fit_span((250, 2000), 2)


def test_a_users_file_gets_the_pycode_presets_rigour(tmp_path: Path) -> None:
    data = _pairs(tmp_path / "pairs.jsonl", 100)
    for preset in ("quick", "full"):
        grid = NegativesStudy(preset, data=str(data)).grid
        assert grid == GRIDS["pycode"][preset]  # n span, fractions, seeds, budget, refinement


def test_a_file_smaller_than_the_span_gets_it_scaled_and_the_report_says_so(
        tmp_path: Path) -> None:
    from crl.experiments.negatives.setup import setup_section

    data = _pairs(tmp_path / "pairs.jsonl", 1000)  # 800 training pairs for the study's runs
    study = NegativesStudy("quick", data=str(data))
    study.check(tmp_path / "s")
    facts = json.loads((tmp_path / "s" / "data.json").read_text())
    quick = GRIDS["pycode"]["quick"]
    assert facts["train_size"] == 800 and facts["preset_ns"] == list(quick.ns)
    assert tuple(facts["fitted_ns"]) == fit_span(quick.ns, 800) == study.grid.ns
    assert max(study.grid.ns) == 800 and study.control_n == 800
    assert study.grid.seeds == quick.seeds and study.grid.refine_runs == quick.refine_runs
    again = NegativesStudy("quick", data=str(data))  # crl report: the same runs from the files
    again.load_state(tmp_path / "s")
    assert [s.run_id for s in again.runs()] == [s.run_id for s in study.runs()]
    assert again.title() == "crl study negatives (quick, n scaled to the file)"
    words = " ".join(setup_section(again, facts, 1).paragraphs)
    assert ("The quick preset's n (250, 500, 1,000, 2,000) need 2,000 training pairs; this "
            "file's training split holds 800, so n is scaled to 100, 200, 400, 800") in words
    given = NegativesStudy("quick", data=str(data), ns=[100, 200])  # --ns: never scaled
    given.check(tmp_path / "g")
    assert given.grid.ns == (100, 200)
    assert "fitted_ns" not in json.loads((tmp_path / "g" / "data.json").read_text())


def test_data_and_config_together_are_refused_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"data": {"name": "synthetic"}, "loss": {"name": "gcl"}}))
    with pytest.raises(CrlValueError) as caught:  # the config's data would win, silently
        NegativesStudy("smoke", config=str(config), data=str(_pairs(tmp_path / "p.jsonl", 10)))
    assert "give `--data` or `--config`, not both" in str(caught.value)
    assert "\n" not in str(caught.value)
