"""Distributed training (issue 8): 2 gloo processes under torchrun equal 1 process.

One torchrun launch (tests/distributed/dist_worker.py) checks the gradient of
``all_gather_with_grad`` and trains the clip, info_nce, siglip and gcl configs; a second one
(``crl train --nproc 2 --resume``) finishes a run the first stopped at step 3. The 1-process
references run in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from crl import distributed
from crl.errors import CrlValueError
from crl.train import config_hash, fit, load_config

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from dist_worker import STOP, gather_case, rank_loss  # noqa: E402

WORLD = 2
RTOL = 1e-5
LOSSES = ("clip", "info_nce", "siglip", "gcl", "clip_tiled", "info_nce_tiled", "gcl_tiled",
          "clip_cached", "gcl_cached")

BASE: dict[str, Any] = {
    "data": {"name": "synthetic", "val_fraction": 0.1, "test_fraction": 0.1,
             "synthetic": {"model": "gaussian_mean_shift", "num_samples": 200, "dim": 8}},
    "model": {"kind": "mlp", "embed_dim": 8, "hidden_dim": 16},
    "optim": {"name": "adamw", "lr": 0.01, "warmup_steps": 2},
    "train": {"seed": 3, "batch_size": 16, "steps": 6, "log_every": 1, "checkpoint_every": 3,
              "eval_every": 4},
    "eval": {"probe": False, "geometry": False, "risk": True, "ks": [1]},
}
LOSS_SECTIONS: dict[str, dict[str, Any]] = {
    "clip": {"loss": {"name": "clip"}},
    # a negatives mask built from the gathered dataset indices
    "info_nce": {"loss": {"name": "info_nce", "temperature": 0.5, "symmetric": True},
                 "negatives": {"regime": "independent", "m": 40, "seed": 1}},
    "siglip": {"loss": {"name": "siglip"}},
    # per-sample u state and a learnable temperature (a parameter outside the model)
    "gcl": {"loss": {"name": "gcl", "temperature": 0.5,
                     "gcl": {"gamma": 0.8, "temperature_mode": "global_learnable"}}},
    # the tiled loss on each rank's rows against the gathered columns
    "clip_tiled": {"loss": {"name": "clip", "block_size": 3}},
    "info_nce_tiled": {"loss": {"name": "info_nce", "temperature": 0.5, "block_size": 5},
                       "negatives": {"regime": "shared", "m": 60, "seed": 2}},
    # small independent sets: some anchors of a batch have no negative, so the ranks' counts
    # of anchors differ and each rank's share of the mean must use the global count; 14 steps
    # pass the end of the first epoch (10 steps), so samples come back on the other rank and
    # use the u that rank received from the all-gather of the updates
    "gcl_tiled": {"loss": {"name": "gcl", "temperature": 0.5, "block_size": 3,
                           "gcl": {"gamma": 0.8}},
                  "negatives": {"regime": "independent", "m": 12, "seed": 3},
                  "train": {**BASE["train"], "steps": 14}},
    "resume": {"loss": {"name": "clip"}},
    # gradient caching on each rank (local batch 8 in micro-batches of 3: 3 + 3 + 2) against
    # the one-process run without it: the same losses and weights (SGD: AdamW would blow the
    # rounding noise of an exactly-zero gradient up to steps of size lr)
    "clip_cached": {"loss": {"name": "clip"}, "optim": {"name": "sgd", "lr": 0.05},
                    "train": {**BASE["train"], "micro_batch_size": 3}},
    "gcl_cached": {"loss": {"name": "gcl", "temperature": 0.5, "block_size": 3,
                            "gcl": {"gamma": 0.8, "temperature_mode": "global_learnable"}},
                   "negatives": {"regime": "independent", "m": 12, "seed": 3},
                   "optim": {"name": "sgd", "lr": 0.05},
                   "train": {**BASE["train"], "micro_batch_size": 3}},
}


def _reference(name: str, path: Path) -> Any:
    """The one-process reference config of a two-process run: the same, without gradient
    caching for the ``*_cached`` runs."""
    cfg = load_config(path)
    if name.endswith("_cached"):
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(
            update={"micro_batch_size": None})})
    return cfg


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD),
            "--master_addr", "127.0.0.1", "--master_port", str(distributed.free_port()), *args]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("dist")
    configs, two, one = root / "configs", root / "two", root / "one"
    configs.mkdir()
    paths = {}
    for name, section in LOSS_SECTIONS.items():
        paths[name] = configs / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump({**BASE, **section}))
    (configs / "odd").mkdir()
    (configs / "odd" / "odd.yaml").write_text(yaml.safe_dump(
        {**BASE, "loss": {"name": "clip"}, "train": {**BASE["train"], "batch_size": 15}}))
    launch = subprocess.run(_torchrun(str(HERE / "dist_worker.py"), str(configs), str(two)),
                            env=_env(), capture_output=True, text=True, timeout=300)
    assert launch.returncode == 0, launch.stderr[-3000:]
    resumed = subprocess.run(
        [sys.executable, "-m", "crl", "train", str(paths["resume"]), "--out", str(two),
         "--resume", "--nproc", str(WORLD), "--no-progress"],
        env=_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    dirs: dict[str, tuple[Path, Path]] = {}
    for name, path in paths.items():
        run_name = f"{name}-{config_hash(load_config(path))}"
        reference = _reference(name, path)
        fit(reference, one / run_name, progress=False)  # the 1-process reference
        dirs[name] = (one / run_name, two / run_name)
    return {"dirs": dirs, "root": two, "resume_stdout": resumed.stdout}


def _train_losses(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]


def _state(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    return {**{f"model.{k}": v for k, v in ckpt["model"].items()},
            **{f"objective.{k}": v for k, v in ckpt["objective"].items()}}


def _assert_rel_close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """``max|a - b| <= RTOL * max|a|`` (NaN entries, GCL's unseen ``u``, must match)."""
    assert a.shape == b.shape, what
    if a.is_floating_point():
        nan = torch.isnan(a)
        assert torch.equal(nan, torch.isnan(b)), what
        a, b = a[~nan].double(), b[~nan].double()
        if a.numel():
            scale = max(float(a.abs().max()), 1e-12)
            assert float((a - b).abs().max()) <= RTOL * scale, (what, a, b)
    else:
        assert torch.equal(a, b), what


def test_gather_with_grad_sums_the_ranks_gradients(runs: dict[str, Any]) -> None:
    x, _ = gather_case(0, WORLD)
    reference = x.clone().requires_grad_(True)
    total = sum(rank_loss(reference, gather_case(r, WORLD)[1], r) for r in range(WORLD))
    total.backward()  # type: ignore[union-attr]
    assert reference.grad is not None
    for r in range(WORLD):
        got = torch.load(runs["root"] / "gather" / f"rank{r}.pt")
        torch.testing.assert_close(got["gathered"], x, rtol=0, atol=0)
        torch.testing.assert_close(got["grad"], reference.grad[r * 3:(r + 1) * 3],
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loss", LOSSES)
def test_two_processes_equal_one(runs: dict[str, Any], loss: str) -> None:
    one, two = runs["dirs"][loss]
    steps_one, steps_two = _train_losses(one), _train_losses(two)
    steps = LOSS_SECTIONS[loss].get("train", BASE["train"])["steps"]
    assert [s for s, _ in steps_one] == list(range(1, steps + 1))
    assert [s for s, _ in steps_two] == [s for s, _ in steps_one]  # rank 0 alone logs
    for (step, a), (_, b) in zip(steps_one, steps_two, strict=True):
        assert abs(a - b) <= RTOL * abs(a), (loss, step, a, b)
    state_one, state_two = _state(one), _state(two)
    assert state_one.keys() == state_two.keys()
    for key in state_one:
        _assert_rel_close(state_one[key], state_two[key], f"{loss}: {key}")
    assert (two / "summary.json").is_file()
    summary_one = json.loads((one / "summary.json").read_text())
    summary_two = json.loads((two / "summary.json").read_text())
    for key in ("val/retrieval/x2y_recall@1", "retrieval/x2y_recall@1", "step"):
        assert summary_one[key] == pytest.approx(summary_two[key], rel=RTOL)


def test_training_moved_the_weights(runs: dict[str, Any]) -> None:
    """Guards the comparison above against a run that never updates anything: the final weights
    differ from the initial ones (rebuilt from the run's config and seed) beyond rounding."""
    from crl.rundir import read_json
    from crl.train import build_run, validate_config

    one, _ = runs["dirs"]["clip"]
    config = validate_config(read_json(one / "config.json")["config"])
    initial = build_run(config, torch.device("cpu")).model.state_dict()
    final = _state(one)
    moved = max(float((final[f"model.{k}"] - v).abs().max() / v.abs().max().clamp_min(1e-12))
                for k, v in initial.items() if v.is_floating_point())
    assert moved > 1e-3, moved


def test_distributed_resume_continues_exactly(runs: dict[str, Any]) -> None:
    one, two = runs["dirs"]["resume"]
    assert f"run directory: {two}" in runs["resume_stdout"]  # printed once, by rank 0
    assert runs["resume_stdout"].count("run directory:") == 1
    steps_one, steps_two = _train_losses(one), _train_losses(two)
    assert [s for s, _ in steps_two] == list(range(1, 7))
    for (_, a), (_, b) in zip(steps_one, steps_two, strict=True):
        assert abs(a - b) <= RTOL * abs(a)
    state_one, state_two = _state(one), _state(two)
    for key in state_one:
        _assert_rel_close(state_one[key], state_two[key], f"resume: {key}")
    assert STOP < 6


def test_batch_not_divisible_by_processes_is_a_clear_error(runs: dict[str, Any]) -> None:
    root = runs["root"]
    for r in range(WORLD):  # every rank raises the same error before touching the run dir
        message = (root / f"odd_error{r}.txt").read_text()
        assert message.startswith("train.batch_size (the global batch) must be divisible by the "
                                  "number of processes 2; got 15")
    assert not (root / "odd").exists()


def test_local_batch_size_and_shard() -> None:
    assert distributed.local_batch_size(16, 2) == 8
    with pytest.raises(CrlValueError, match=r"train\.batch_size .* divisible .* got 15"):
        distributed.local_batch_size(15, 2)
    batch = list(range(100, 112))
    parts = [distributed.shard(batch, r, 3) for r in range(3)]
    assert parts == [batch[0:4], batch[4:8], batch[8:12]]  # contiguous, in rank order
