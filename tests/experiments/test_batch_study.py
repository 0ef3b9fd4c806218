"""``crl study batch``: the grid and its run configs, the losses it refuses, the cost meter, and
one small run through the CLI that an identical second command resumes without retraining."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from crl.cli import app
from crl.errors import CrlValueError
from crl.experiments.batch import BatchStudy
from crl.experiments.batch.cost import Meter
from crl.experiments.batch.grid import IN_BATCH_LOSSES
from crl.experiments.registry import get_study

runner = CliRunner()

CONFIG = """\
data: {name: synthetic, synthetic: {model: correlated_gaussian, dim: 8, rho: 0.6,
       num_samples: 800}}
model: {kind: linear, embed_dim: 8}
loss: {name: LOSS, temperature: 0.1}
optim: {name: adamw, lr: 0.01}
train: {batch_size: 32, steps: 10}
eval: {probe: false, geometry: false}
"""


def _config(tmp_path: Path, loss: str = "info_nce", extra: str = "") -> str:
    path = tmp_path / f"{loss}.yaml"
    path.write_text(CONFIG.replace("LOSS", loss) + extra)
    return str(path)


def test_the_default_grid_is_the_pycode_bag_with_clip_at_a_fixed_budget() -> None:
    study = get_study("batch", preset="quick")
    assert isinstance(study, BatchStudy)
    specs = study.runs()
    grid = study.grid
    assert len(specs) == len(grid.batches) * len(grid.seeds)
    for spec in specs:
        b = spec.tags["batch_size"]
        train = spec.config["train"]
        assert spec.tags["m"] == b - 1
        assert train["batch_size"] == b and train["max_samples"] == grid.budget
        assert spec.tags["steps"] == math.ceil(grid.budget / b)
        # gradient caching exactly for the batches above the micro-batch
        assert train["micro_batch_size"] == (256 if b > 256 else None)
        assert spec.config["loss"]["name"] == "clip"
        assert spec.config["model"]["kind"] == "embedding_bag"
    # paired seeds: one seed, one data subset and initialisation at every B
    by_seed = {s.tags["seed"]: s.config["data"] for s in specs if s.tags["batch_size"] == 8}
    assert all(s.config["data"] == by_seed[s.tags["seed"]] for s in specs)


def test_a_users_in_batch_config_keeps_its_loss_model_and_optimiser(tmp_path: Path) -> None:
    study = get_study("batch", preset="smoke", config=_config(tmp_path, "clip"),
                      batches=[8, 64], budget=640, micro_batch_size=16)
    specs = {s.tags["batch_size"]: s.config for s in study.runs()}
    for b, config in specs.items():
        assert config["loss"]["name"] == "clip" and config["model"]["kind"] == "linear"
        assert config["optim"]["lr"] == 0.01
        assert config["train"]["steps"] is None and config["train"]["max_samples"] == 640
        assert config["train"]["micro_batch_size"] == (16 if b > 16 else None)


@pytest.mark.parametrize(("loss", "extra", "names"), [
    ("gcl", "", "loss.name must be an in-batch loss (" + ", ".join(IN_BATCH_LOSSES)),
    ("info_nce", "negatives: {regime: shared, m: 10}\n", "negatives.regime must be 'in_batch'"),
])
def test_a_loss_without_in_batch_negatives_is_refused_in_one_line(
        tmp_path: Path, loss: str, extra: str, names: str) -> None:
    path = _config(tmp_path, loss, extra)
    with pytest.raises(CrlValueError, match="study batch") as info:
        get_study("batch", preset="smoke", config=path)
    assert names in str(info.value)
    result = runner.invoke(app, ["study", "batch", "--config", path, "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert names in result.output and result.output.count("\n") == 1


@pytest.mark.parametrize(("options", "message"), [
    ({"batches": [16]}, "`--batches` needs at least 2 batch sizes"),
    ({"batches": [1, 16]}, "`--batches` must be integers >= 2"),
    ({"tolerance": "much"}, "`--tolerance`"),
    ({"metric": "accuracy"}, "`--metric`: has no declared direction"),
])
def test_bad_options_name_the_flag(options: dict[str, object], message: str) -> None:
    with pytest.raises(CrlValueError, match="study batch") as info:
        get_study("batch", preset="smoke", **options)
    assert message in str(info.value)


def test_the_meter_sees_the_loops_peak_memory_and_time() -> None:
    meter = Meter.start(torch.device("cpu"))
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    block.add_(1.0)
    del block
    cost = meter.stop(steps=4)
    assert cost["cost/steps_timed"] == 4
    assert cost["cost/step_s"] == pytest.approx(cost["cost/loop_s"] / 4)
    if cost["cost/rss_method"] == "VmHWM":  # Linux: the peak after a reset
        assert cost["cost/peak_rss_growth_mib"] >= 60
    assert math.isnan(cost["cost/peak_cuda_mib"])


def test_a_tiny_sweep_through_the_cli_then_the_same_command_resumes(tmp_path: Path) -> None:
    command = ["study", "batch", "--preset", "smoke", "--config", _config(tmp_path),
               "--batches", "4,8,16", "--seeds", "0,1", "--budget", "128", "--num-train", "128",
               "--micro-batch-size", "8", "--refine-runs", "0", "--workers", "1",
               "--no-progress", "--out", str(tmp_path / "out")]
    first = runner.invoke(app, command)
    assert first.exit_code == 0, first.output
    study_dir = tmp_path / "out" / "batch"
    assert "B*" in first.output and "report:" in first.output
    analysis = json.loads((study_dir / "analysis.json").read_text())
    numbers = analysis["numbers"]
    assert numbers["budget"] == 128 and numbers["n"] == 128
    assert [b["batch_size"] for b in numbers["per_batch"]] == [4, 8, 16]
    assert [b["micro_batch_size"] for b in numbers["per_batch"]] == [None, None, 8]
    for b in numbers["per_batch"]:
        assert b["runs"] == 2 and b["steps"] == math.ceil(128 / b["batch_size"])
        assert b["step_s"] > 0 and b["peak_rss_growth_mib"] >= 0
    assert numbers["status"] in ("located", "below", "above")
    assert (numbers["b_star"] is None) == (numbers["status"] != "located")
    with (study_dir / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and {"cost/step_s", "cost/peak_rss_growth_mib", "m"} <= set(rows[0])
    assert (study_dir / "report.html").stat().st_size > 1000
    stamps = {p: p.stat().st_mtime_ns for p in study_dir.glob("*/summary.json")}
    assert len(stamps) == 6
    again = runner.invoke(app, command)
    assert again.exit_code == 0, again.output
    assert {p: p.stat().st_mtime_ns for p in study_dir.glob("*/summary.json")} == stamps
    assert json.loads((study_dir / "analysis.json").read_text())["numbers"]["cell"] == \
        numbers["cell"]
