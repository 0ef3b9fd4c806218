"""``crl train PRESET --smoke`` and ``crl eval RUN_DIR`` through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from crl.cli import app
from crl.train import config_hash, load_config, smoke_config

runner = CliRunner()


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["synthetic-gaussian", "digits-simclr", "pycode-clip"])
def test_smoke_train_then_eval(preset: str, tmp_path: Path) -> None:
    if preset == "pycode-clip":
        pytest.importorskip("sentence_transformers")
    args = ["train", preset, "--smoke", "--out", str(tmp_path), "--no-progress",
            "--set", "train.num_threads=1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    cfg = smoke_config(load_config(preset, ["train.num_threads=1"]))
    run_dir = tmp_path / f"{preset}-{config_hash(cfg)}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 20 and summary["run_id"] == config_hash(cfg)
    # Recall grows with k and ranks start at 1 (a wrong rank computation breaks one of them).
    for way in ("x2y", "y2x"):
        recalls = [summary[f"retrieval/{way}_recall@{k}"] for k in sorted(cfg.eval.ks)]
        assert recalls == sorted(recalls), recalls
        assert summary[f"retrieval/{way}_mean_rank"] >= 1
    if preset == "digits-simclr":  # ten classes: chance is 0.1, random CNN features give 0.95
        assert summary["probe/linear_acc"] > 0.5
    result = runner.invoke(app, ["eval", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "retrieval/x2y_recall@1" in result.output
    stored = json.loads((run_dir / "eval.json").read_text())
    assert stored["metrics"]["retrieval/x2y_recall@1"] == pytest.approx(
        summary["retrieval/x2y_recall@1"])
    # Running again without --resume refuses to overwrite; with --resume it is a no-op.
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "already holds" in again.output
    assert runner.invoke(app, [*args, "--resume"]).exit_code == 0


def test_bad_config_is_one_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "synthetic-gaussian", "--set", "train.stepz=3",
                                 "--set", "optim.lr=-1", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "train.stepz: unknown key" in result.output and "optim.lr" in result.output
    assert not any(tmp_path.iterdir())
    result = runner.invoke(app, ["eval", str(tmp_path)])
    assert result.exit_code == 2 and "not a run directory" in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "synthetic-gaussian", "--smoke", "--device", "cuda",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 2 and "CUDA is not available" in result.output
