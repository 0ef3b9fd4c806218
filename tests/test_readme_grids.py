"""README.md's table of each preset's grid per data kind is the code's (the grids of
crl.experiments.negatives.grid, rendered by grid_table), in the section "The main job"; the
section "Your own model" holds a config crl train loads and commands whose flags exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crl.experiments.negatives.grid import GRIDS, distinct_runs, grid_table

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end]


def test_the_main_jobs_grid_table_is_the_codes() -> None:
    assert grid_table() in _section("The main job")


def test_the_quick_preset_counts_the_readme_states() -> None:
    quick = GRIDS["pycode"]["quick"]  # "144 on the grid, 96 added by its refinement"
    assert distinct_runs(quick) == 144 and quick.refine_runs == 96
    assert GRIDS["files"]["quick"] == quick


def test_your_own_model_config_loads_and_its_commands_take_their_flags(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The section "Your own model": its minilm.yaml is a config `crl train` loads (the bundled
    MiniLM, frozen lower layers, loss clip), and every flag of its crl commands exists."""
    from typer.testing import CliRunner

    from crl.cli import app
    from crl.train import load_config

    section = _section("Your own model")
    config = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert len(config) == 1
    monkeypatch.chdir(tmp_path)
    for name in ("train.jsonl", "test.jsonl"):
        (tmp_path / name).write_text('{"short": "add", "long": "add two numbers"}\n')
    (tmp_path / "minilm.yaml").write_text(config[0])
    cfg = load_config("minilm.yaml")
    assert cfg.model.kind == "transformer" and cfg.model.pretrained is None
    assert cfg.model.freeze_layers == 4 and cfg.loss.name == "clip"
    assert cfg.data.files.test_path == "test.jsonl" and cfg.data.files.columns.a == "short"
    commands = re.findall(r"^crl (\w+(?: negatives)?)([^#\n]*)", section, re.M)
    assert {c for c, _ in commands} == {"eval", "study negatives", "train", "export"}
    runner = CliRunner()
    for command, args in commands:
        helped = runner.invoke(app, [*command.split(), "--help"], terminal_width=200)
        assert helped.exit_code == 0, helped.output
        for flag in re.findall(r"(--[\w-]+)", args):
            assert flag in helped.output, (command, flag)
