"""Config loading: presets, --set parsing, unknown keys, all errors reported together."""

from __future__ import annotations

from pathlib import Path

import pytest

from crl.errors import CrlValueError
from crl.train import (
    TrainConfig,
    apply_overrides,
    config_hash,
    load_config,
    preset_names,
    smoke_config,
)


def test_presets_load_and_shrink() -> None:
    assert {"digits-simclr", "pycode-clip", "synthetic-gaussian"} <= set(preset_names())
    for name in preset_names():
        cfg = load_config(name)
        small = smoke_config(cfg)
        assert small.train.total_steps(num_train=256) == 20
        assert small.train.batch_size <= 32
        if cfg.data.name != "pycode":
            assert small.data.num_train is not None and small.data.num_train <= 256
        assert small.model == cfg.model and small.loss == cfg.loss


def test_set_overrides_parse_yaml_scalars() -> None:
    cfg = load_config("synthetic-gaussian", [
        "train.steps=7", "optim.lr=1e-2", "loss.symmetric=true", "eval.ks=[1, 3]",
        "optim.grad_clip=null", "loss.gcl.gamma=0.5", "negatives.regime=shared",
        "negatives.m=10"])
    assert cfg.train.steps == 7 and cfg.optim.lr == 0.01 and cfg.loss.symmetric is True
    assert cfg.eval.ks == [1, 3] and cfg.optim.grad_clip is None
    assert cfg.loss.gcl.gamma == 0.5 and cfg.negatives.m == 10
    assert apply_overrides({}, ["a.b.c=x y"]) == {"a": {"b": {"c": "x y"}}}


@pytest.mark.parametrize("bad", ["train.steps", "=3", "train..steps=3", "train.steps.x=3"])
def test_bad_set_syntax(bad: str) -> None:
    with pytest.raises(CrlValueError, match="--set"):
        load_config("synthetic-gaussian", [bad])


def test_unknown_key_lists_valid_keys_and_all_errors_together(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "data:\n  name: digits\n  digitz: {}\n"
        "loss:\n  name: infonce\n  temperature: -1\n"
        "optim:\n  lr: 0\n"
        "trian:\n  steps: 3\n"
    )
    with pytest.raises(CrlValueError) as info:
        load_config(path)
    text = str(info.value)
    assert "5 error(s)" in text
    lines = text.splitlines()[1:]
    assert len(lines) == 5
    assert any(line.strip().startswith("data.digitz: unknown key") and "digits" in line
               and "num_train" in line for line in lines)
    assert any(line.strip().startswith("trian: unknown key") and "train" in line
               and "negatives" in line for line in lines)
    assert any(line.strip().startswith("loss.name:") and "'clip'" in line for line in lines)
    assert any(line.strip().startswith("loss.temperature:") for line in lines)
    assert any(line.strip().startswith("optim.lr:") for line in lines)


def test_cross_field_errors_name_the_section() -> None:
    with pytest.raises(CrlValueError, match=r"train: .*exactly one of epochs / steps"):
        load_config("synthetic-gaussian", ["train.epochs=2"])
    with pytest.raises(CrlValueError, match=r"negatives\.regime must be 'in_batch'"):
        load_config("synthetic-gaussian", ["loss.name=supcon", "negatives.regime=shared",
                                           "negatives.m=3"])
    with pytest.raises(CrlValueError, match="negatives"):
        load_config("synthetic-gaussian", ["negatives.regime=shared"])  # no m


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(CrlValueError, match=r"presets: .*digits-simclr"):
        load_config("no-such-preset")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(CrlValueError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(CrlValueError, match="mapping"):
        load_config(scalar)


def test_budget_and_hash() -> None:
    cfg = load_config("synthetic-gaussian", ["train.steps=null", "train.max_samples=1000",
                                             "train.batch_size=64"])
    assert cfg.train.total_steps(num_train=500) == 16  # ceil(1000 / 64)
    cfg = load_config("synthetic-gaussian", ["train.steps=null", "train.epochs=3"])
    assert cfg.train.total_steps(num_train=1000) == 3 * (1000 // 128)
    assert TrainConfig().train.total_steps(num_train=10) == 1000
    a, b = load_config("digits-simclr"), load_config("digits-simclr")
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash(load_config("digits-simclr", ["train.seed=1"]))
    assert len(config_hash(a)) == 8


def test_the_big_batch_example_of_the_docs_is_a_valid_config(tmp_path: Path) -> None:
    text = (Path(__file__).parents[2] / "docs" / "training.md").read_text()
    block = text.split("# big-batch.yaml")[1].split("\n", 1)[1].split("```")[0]
    (tmp_path / "big-batch.yaml").write_text(block)
    cfg = load_config(tmp_path / "big-batch.yaml")
    assert (cfg.train.micro_batch_size, cfg.train.precision) == (32, "bf16")
    assert cfg.model.gradient_checkpointing and cfg.train.batch_size == 4096
