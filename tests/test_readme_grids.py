"""README.md's table of each preset's grid per data kind is the code's (the grids of
crl.experiments.negatives.grid, rendered by grid_table), in the section "The main job"."""

from __future__ import annotations

from pathlib import Path

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
