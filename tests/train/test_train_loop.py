"""fit: the run directory, determinism, resume bit for bit, bad resumes and non-finite losses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

import crl.train.loop as loop
import crl.train.steps.single as single_step
from crl.errors import CrlError
from crl.rundir import read_jsonl
from crl.train import (
    NonFiniteLossError,
    Step,
    TrainConfig,
    config_hash,
    evaluate_run,
    fit,
    load_config,
)

# A tiny synthetic run: 256 training pairs, batches of 32 (8 steps per epoch), 20 steps.
_BASE = [
    "data.num_train=256", "data.synthetic.num_samples=400", "train.batch_size=32",
    "train.steps=20", "train.log_every=3", "train.eval_every=8", "train.checkpoint_every=8",
    "train.num_threads=1", "optim.warmup_steps=4", "model.kind=mlp", "model.embed_dim=8",
    "model.hidden_dim=16", "eval.ks=[1, 5]",
]


def _config(*extra: str, preset: str = "synthetic-gaussian") -> TrainConfig:
    return load_config(preset, [*_BASE, *extra])


def _weights(run_dir: Path) -> dict[str, Any]:
    state = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)
    return {"model": state["model"], "objective": state["objective"], "step": state["step"]}


def _assert_same_state(x: dict[str, Any], y: dict[str, Any]) -> None:
    assert x["step"] == y["step"]
    for part in ("model", "objective"):
        assert x[part].keys() == y[part].keys()
        for key in x[part]:
            a, b = x[part][key], y[part][key]
            assert torch.equal(a, b) or (a.dtype.is_floating_point and torch.allclose(
                a, b, rtol=0, atol=1e-6, equal_nan=True)), f"{part}.{key}"


def _count_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the optimiser steps :func:`fit` takes from now on."""
    counter = [0]
    original = loop.build_step

    def counting(*args: Any, **kwargs: Any) -> Step:
        strategy = original(*args, **kwargs)

        def step(runs: Any, batch: Any) -> list[tuple[float, dict[str, float]]]:
            counter[0] += 1
            return strategy(runs, batch)

        return step

    monkeypatch.setattr(loop, "build_step", counting)
    return counter


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return read_jsonl(run_dir / "metrics.jsonl")


def _summary(run_dir: Path) -> dict[str, Any]:
    data = json.loads((run_dir / "summary.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("time/")}


def test_run_directory_contents(tmp_path: Path) -> None:
    cfg = _config()
    result = fit(cfg, tmp_path / "run", progress=False)
    run = result.run_dir
    assert result.finished and result.step == 20
    assert sorted(p.name for p in run.iterdir()) == [
        "checkpoint.pt", "config.json", "metrics.jsonl", "summary.json"]
    stored = json.loads((run / "config.json").read_text())
    assert stored["run_id"] == config_hash(cfg) and stored["total_steps"] == 20
    assert stored["environment"]["crl"] and TrainConfig.model_validate(stored["config"]) == cfg
    records = _records(run)
    train_steps = [r["step"] for r in records if "train/loss" in r]
    assert train_steps == [3, 6, 9, 12, 15, 18, 20]
    evals = [(r["step"], r["split"]) for r in records if "split" in r]
    assert evals == [(8, "val"), (16, "val"), (20, "val"), (20, "test")]
    summary = result.summary
    assert summary["step"] == 20 and summary["run_id"] == config_hash(cfg)
    for key in ("retrieval/x2y_recall@1", "retrieval/y2x_recall@5", "retrieval/x2y_auc",
                "retrieval/y2x_median_rank", "geometry/alignment", "geometry/uniformity",
                "risk/contrastive", "val/retrieval/x2y_recall@1"):
        assert isinstance(summary[key], float), key
    assert summary["train/loss"] == records[-3]["train/loss"]  # the step-20 train record


def test_same_config_gives_same_numbers(tmp_path: Path) -> None:
    cfg = _config("loss.name=clip")
    fit(cfg, tmp_path / "a", progress=False)
    fit(cfg, tmp_path / "b", progress=False)
    assert _records(tmp_path / "a") == _records(tmp_path / "b")
    assert _summary(tmp_path / "a") == _summary(tmp_path / "b")
    _assert_same_state(_weights(tmp_path / "a"), _weights(tmp_path / "b"))
    other = fit(_config("loss.name=clip", "train.seed=1"), tmp_path / "c", progress=False)
    assert other.summary["train/loss"] != _summary(tmp_path / "a")["train/loss"]


@pytest.mark.parametrize(("extra", "stop"), [
    (("loss.name=info_nce",), 11),
    (("loss.name=gcl", "loss.gcl.gamma_schedule=cosine", "loss.gcl.gamma_min=0.3",
      "negatives.regime=independent", "negatives.m=40"), 13),
    (("loss.name=siglip", "optim.name=sgd", "optim.lr=0.05"), 8),
    (("loss.name=clip", "train.sampler=no_duplicates", "train.micro_batch_size=10",
      "train.precision=bf16"), 11),
])
def test_resume_equals_uninterrupted(tmp_path: Path, extra: tuple[str, ...], stop: int,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config(*extra)
    fit(cfg, tmp_path / "full", progress=False)
    part = fit(cfg, tmp_path / "cut", progress=False, stop_at=stop)
    assert not part.finished and part.step == stop
    assert not (tmp_path / "cut" / "summary.json").exists()
    steps = _count_steps(monkeypatch)
    done = fit(cfg, tmp_path / "cut", progress=False, resume=True)
    assert done.finished and done.step == 20
    assert steps == [20 - stop]  # it continued; it did not start over
    assert _records(tmp_path / "cut") == _records(tmp_path / "full")
    assert _summary(tmp_path / "cut") == _summary(tmp_path / "full")
    _assert_same_state(_weights(tmp_path / "cut"), _weights(tmp_path / "full"))
    # Resuming a finished run returns it unchanged.
    again = fit(cfg, tmp_path / "cut", progress=False, resume=True)
    assert again.summary == done.summary


def test_gradient_caching_trains_like_one_pass(tmp_path: Path) -> None:
    """A run in micro-batches of 10 (32 = 10 + 10 + 10 + 2) takes the one-pass run's steps:
    the same losses and weights after 20 steps, to float32 rounding. (SGD: AdamW would turn the
    rounding noise of a gradient that is exactly zero, here the last bias of the b tower, into
    steps of size lr.)"""
    extra = ("loss.name=gcl", "negatives.regime=independent", "negatives.m=40",
             "optim.name=sgd", "optim.lr=0.05")
    plain = fit(_config(*extra), tmp_path / "plain", progress=False)
    cached = fit(_config(*extra, "train.micro_batch_size=10"), tmp_path / "cached",
                 progress=False)
    losses = [(r["step"], r["train/loss"]) for r in _records(plain.run_dir) if "train/loss" in r]
    again = [(r["step"], r["train/loss"]) for r in _records(cached.run_dir) if "train/loss" in r]
    assert [s for s, _ in again] == [s for s, _ in losses]
    for (_, a), (_, b) in zip(losses, again, strict=True):
        assert b == pytest.approx(a, rel=1e-5)
    x, y = _weights(plain.run_dir), _weights(cached.run_dir)
    for part in ("model", "objective"):
        for key, value in x[part].items():
            seen = ~torch.isnan(value) if value.is_floating_point() else None
            if seen is not None and bool(seen.any()):
                scale = max(float(value[seen].abs().max()), 1e-12)
                assert float((value[seen] - y[part][key][seen]).abs().max()) <= 1e-5 * scale, key


def test_resume_with_augmented_images_mid_epoch(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    extra = ("model.kind=cnn", "model.cnn_channels=[4]", "model.hidden_dim=16",
             "model.embed_dim=8", "data.num_train=64", "train.batch_size=16", "train.steps=10",
             "train.eval_every=null", "train.checkpoint_every=5", "eval.probe=false")
    cfg = load_config("digits-simclr", [*_BASE, *extra])
    fit(cfg, tmp_path / "full", progress=False)
    fit(cfg, tmp_path / "cut", progress=False, stop_at=6)  # epoch 1, position 2 of 4
    steps = _count_steps(monkeypatch)
    fit(cfg, tmp_path / "cut", progress=False, resume=True)
    assert steps == [4]
    assert _records(tmp_path / "cut") == _records(tmp_path / "full")
    _assert_same_state(_weights(tmp_path / "cut"), _weights(tmp_path / "full"))


def test_resume_drops_records_after_the_checkpoint_and_a_torn_line(tmp_path: Path) -> None:
    cfg = _config()
    fit(cfg, tmp_path / "full", progress=False)
    run = tmp_path / "cut"
    fit(cfg, run, progress=False, stop_at=16)
    with open(run / "metrics.jsonl", "a") as handle:  # a crash after the checkpoint
        handle.write(json.dumps({"step": 17, "train/loss": 123.0}) + "\n")
        handle.write('{"step": 18, "train/lo')
    assert _records(run)[-1]["step"] == 17  # the torn line is ignored by the reader
    fit(cfg, run, progress=False, resume=True)
    assert _records(run) == _records(tmp_path / "full")


def test_bad_resumes_change_nothing(tmp_path: Path) -> None:
    cfg = _config()
    run = tmp_path / "run"
    fit(cfg, run, progress=False, stop_at=8)
    with pytest.raises(CrlError, match="already holds"):
        fit(cfg, run, progress=False)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(CrlError, match="belongs to config"):
        fit(_config("optim.lr=0.5"), run, progress=False, resume=True)
    data = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    truncated = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(CrlError, match="truncated or corrupt"):
        fit(cfg, run, progress=False, resume=True)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == truncated
    assert before.keys() == truncated.keys()


def test_version_mismatch_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config()
    run = tmp_path / "run"
    fit(cfg, run, progress=False, stop_at=8)
    monkeypatch.setattr("crl.train.checkpoint.__version__", "999.0")
    with pytest.raises(CrlError, match=r"crl 0\.1\.0, this is crl 999\.0"):
        fit(cfg, run, progress=False, resume=True)


def test_non_finite_loss_stops_without_nan_weights(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    original = single_step.batch_loss

    def flaky(*args: Any, **kwargs: Any) -> tuple[Tensor, dict[str, float]]:
        calls["n"] += 1  # the objective's one call per step
        loss, logs = original(*args, **kwargs)
        return (loss * float("nan") if calls["n"] == 11 else loss), logs

    monkeypatch.setattr(single_step, "batch_loss", flaky)
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match=r"at step 11;.*checkpoint.pt at step 8"):
        fit(_config(), run, progress=False)
    state = torch.load(run / "checkpoint.pt", weights_only=False)
    assert state["step"] == 8
    assert all(bool(torch.isfinite(v).all()) for v in state["model"].values())
    assert not (run / "summary.json").exists()


def test_evaluate_run_reproduces_the_summary(tmp_path: Path) -> None:
    cfg = _config()
    result = fit(cfg, tmp_path / "run", progress=False)
    metrics = evaluate_run(tmp_path / "run")
    for key, value in metrics.items():
        assert value == pytest.approx(result.summary[key], abs=1e-9), key
    stored = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert stored["split"] == "test" and stored["step"] == 20
    with pytest.raises(CrlError, match="not a run directory"):
        evaluate_run(tmp_path)


def test_tensorboard_without_the_package_is_a_clear_error(tmp_path: Path) -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(CrlError, match=r"pip install crl\[tensorboard\]"):
            fit(_config(), tmp_path / "run", progress=False, tensorboard=True)
    else:
        fit(_config(), tmp_path / "run", progress=False, tensorboard=True)
        assert any((tmp_path / "run" / "tensorboard").iterdir())


def test_hard_negatives_from_a_file_train_alike_with_gradient_caching(tmp_path: Path) -> None:
    """A table with a hard-negative column: the batches carry them to the objective (the loss
    differs from the run without them), and micro-batches of 5 take the same steps."""
    words = "add sum sort list read file open close join split count value key item".split()
    rows = []
    for i in range(60):
        query = f"{words[i % 14]} {words[(i * 3) % 14]} {i}"
        rows.append({"query": query, "doc": f"def f{i}(): {query} {words[(i * 5) % 14]}",
                     "hard": f"def g{i}(): {words[(i * 7) % 14]} {query}"})
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["data.name=files", f"data.files.path={path}", "model.kind=embedding_bag",
            "model.embed_dim=8", "data.val_fraction=0.1", "data.test_fraction=0.2",
            "train.batch_size=16", "train.steps=6", "train.log_every=1", "optim.name=sgd",
            "optim.lr=0.1", "loss.name=info_nce", "eval.probe=false", "train.num_threads=1"]
    hard = "data.files.columns={a: query, b: doc, negatives: [hard]}"
    plain = "data.files.columns={a: query, b: doc}"

    def losses(*extra: str) -> list[float]:
        cfg = load_config("synthetic-gaussian", [*base, *extra])
        run = fit(cfg, tmp_path / config_hash(cfg), progress=False)
        return [r["train/loss"] for r in _records(run.run_dir) if "train/loss" in r]

    with_hard = losses(hard)
    assert losses(hard, "train.micro_batch_size=5") == pytest.approx(with_hard, rel=1e-5)
    assert losses(plain)[0] != pytest.approx(with_hard[0], rel=1e-3)
