"""A study resumed by another crl starts over the runs that crl left half done (their checkpoint
belongs to another resolved config or version) and gets the result of a fresh run; ``fit`` itself
still refuses them, and a corrupt checkpoint is still refused, not silently retrained."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

from crl.errors import CrlError, StaleRunError
from crl.experiments.executors import execute_run
from crl.experiments.negatives import NegativesStudy
from crl.experiments.runs import fit_study_run
from crl.rundir import read_json, read_jsonl
from crl.train import TrainConfig, config_hash, fit, load_config, validate_config
from crl.train.checkpoint import save_checkpoint

# 64 pairs, batches of 16, 8 steps, a checkpoint every 2 (stopped at 4: half done).
TINY = ["data.num_train=64", "data.synthetic.num_samples=128", "train.batch_size=16",
        "train.steps=8", "train.checkpoint_every=2", "train.log_every=1", "train.num_threads=1",
        "eval.ks=[1]", "eval.probe=false"]


def _config(*extra: str) -> TrainConfig:
    return load_config("synthetic-gaussian", [*TINY, *extra])


def _results(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if not k.startswith("time/")}


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The summary of the target config trained in one go."""
    run = tmp_path_factory.mktemp("fresh") / "run"
    return fit(_config(), run, progress=False).summary


def _assert_fresh_result(run: Path, fresh: dict[str, Any]) -> None:
    summary = read_json(run / "summary.json")
    assert summary["run_id"] == config_hash(_config())
    assert _results(summary) == _results(fresh)
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r]
    assert steps == sorted(set(steps)), "the stale attempt's records were kept"


def test_a_checkpoint_of_another_resolved_config_starts_over(
        tmp_path: Path, fresh: dict[str, Any]) -> None:
    run = tmp_path / "run"
    fit(_config("optim.lr=0.5"), run, progress=False, stop_at=4)
    with pytest.raises(StaleRunError, match="belongs to config"):
        fit(_config(), run, progress=False, resume=True)  # the trainer alone still refuses
    result = fit_study_run(_config(), run, resume=True)
    assert result.finished
    _assert_fresh_result(run, fresh)


def test_a_checkpoint_of_another_crl_version_starts_over(
        tmp_path: Path, fresh: dict[str, Any]) -> None:
    run = tmp_path / "run"
    fit(_config(), run, progress=False, stop_at=4)
    state = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=True)
    save_checkpoint(run / "checkpoint.pt", {**state, "crl_version": "0.0.1"})
    with pytest.raises(StaleRunError, match=r"written by crl 0\.0\.1"):
        fit(_config(), run, progress=False, resume=True)
    fit_study_run(_config(), run, resume=True)
    _assert_fresh_result(run, fresh)


def test_a_finished_run_of_another_config_is_retrained(
        tmp_path: Path, fresh: dict[str, Any]) -> None:
    run = tmp_path / "run"
    fit(_config("train.seed=3"), run, progress=False)
    fit_study_run(_config(), run, resume=True)
    _assert_fresh_result(run, fresh)


def test_a_matching_checkpoint_is_resumed_not_restarted(
        tmp_path: Path, fresh: dict[str, Any]) -> None:
    run = tmp_path / "run"
    fit(_config(), run, progress=False, stop_at=4)
    first = read_jsonl(run / "metrics.jsonl")
    fit_study_run(_config(), run, resume=True)
    assert read_jsonl(run / "metrics.jsonl")[:len(first)] == first
    assert _results(read_json(run / "summary.json")) == _results(fresh)


def test_a_corrupt_checkpoint_is_refused_and_kept(tmp_path: Path) -> None:
    run = tmp_path / "run"
    fit(_config(), run, progress=False, stop_at=4)
    data = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    before = _hashes(run)
    with pytest.raises(CrlError, match="truncated or corrupt") as info:
        fit_study_run(_config(), run, resume=True)
    assert not isinstance(info.value, StaleRunError)
    assert _hashes(run) == before


def test_the_negatives_study_finishes_a_run_another_crl_left_half_done(tmp_path: Path) -> None:
    study = NegativesStudy("smoke", data="synthetic")
    spec = study.runs()[0]
    run = tmp_path / spec.run_id
    config = validate_config(spec.config, origin="test")
    reference = fit(config, tmp_path / "reference", progress=False).summary
    # Another crl resolved the same study options to another config (here: another default).
    older = config.model_copy(update={"optim": config.optim.model_copy(update={"lr": 0.5})})
    fit(older, run, progress=False, stop_at=4)
    assert execute_run(study, spec, run)
    summary = read_json(run / "summary.json")
    assert summary["run_id"] == config_hash(config)
    assert _results(summary) == _results(reference)
