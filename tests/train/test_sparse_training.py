"""Training with ``model.sparse=True``: lazy AdamW leaves unused rows alone, the first step is
the dense model's, a resumed run ends as an uninterrupted one, grouped runs equal lone runs,
and ``crl train`` takes the option (docs/training.md, section "Sparse embedding gradients")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from crl.cli import app
from crl.experiments.negatives.grid import GRIDS, default_run_config
from crl.rundir import CHECKPOINT_FILE, METRICS_FILE
from crl.train import fit, validate_config
from crl.train.build import build_run
from crl.train.grouped import fit_group

MODEL = {"kind": "embedding_bag", "embed_dim": 16, "token_dim": 8, "head": "linear",
         "max_tokens": 16, "bigram_buckets": 32, "sparse": True}
TABLE = "tower_a.backbone.bag.weight"


@pytest.fixture
def pairs(tmp_path: Path) -> dict[str, Any]:
    """The data section of 120 short text pairs from a vocabulary of a dozen words."""
    data = tmp_path / "pairs.jsonl"
    words = ["sum", "list", "parse", "file", "open", "read", "sort", "key", "value", "map"]
    rows = [{"a": f"{words[i % 10]} the {words[(i * 3) % 10]} item {i}",
             "b": f"def f{i}(): return {words[i % 10]}_{words[(i * 7) % 10]}"} for i in range(120)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    return {"name": "files", "files": {"path": str(data)}}


def _config(data: dict[str, Any], *, sparse: bool = True, m: int = 5, regime: str = "shared",
            **optim: Any) -> Any:
    config = default_run_config(data, {**MODEL, "sparse": sparse}, GRIDS["synthetic"]["smoke"],
                                n=64, m=m, regime=regime, seed=1, temperature=0.1,
                                probe=False, device=None)
    config["train"].update(max_samples=448, log_every=1, checkpoint_every=4, num_threads=1)
    config["optim"].update(optim)
    return validate_config(config)


def _final(run_dir: Path, part: str = "model") -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)[part]
    return state


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]


def test_rows_no_batch_used_keep_their_initial_values(pairs: dict[str, Any],
                                                      tmp_path: Path) -> None:
    initial = {sparse: build_run(_config(pairs, sparse=sparse), torch.device("cpu"))
               .model.state_dict()[TABLE].clone() for sparse in (True, False)}
    assert torch.equal(initial[True], initial[False])  # the same initial table
    for sparse in (True, False):
        fit(_config(pairs, sparse=sparse), tmp_path / str(sparse), progress=False)
    kept = {sparse: (_final(tmp_path / str(sparse))[TABLE] == initial[sparse]).all(dim=1)
            for sparse in (True, False)}
    # a dozen words use a few hundred of the 30,554 rows: lazy AdamW leaves the others alone,
    # AdamW decays every row but the pad row (zero) at every step
    assert int(kept[True].sum()) > 30_000
    assert int(kept[False].sum()) == 1


def test_the_first_step_is_the_dense_models_without_weight_decay(pairs: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    # At step 1 a row without gradient has zero moments: AdamW moves it by 0, as lazy AdamW.
    runs = {}
    for sparse in (True, False):
        config = _config(pairs, sparse=sparse, weight_decay=0.0, grad_clip=0.01)
        fit(config, tmp_path / str(sparse), progress=False, stop_at=1)
        runs[sparse] = (_records(tmp_path / str(sparse))[0], _final(tmp_path / str(sparse)))
    (sparse_log, sparse_model), (dense_log, dense_model) = runs[True], runs[False]
    assert sparse_log["train/grad_norm"] > 0.01  # clipped
    assert sparse_log["train/grad_norm"] == pytest.approx(dense_log["train/grad_norm"], rel=1e-6)
    assert sparse_log["train/loss"] == dense_log["train/loss"]  # the same initial model
    for name, value in dense_model.items():
        # The sparse bag sums the table's gradient in another order (crl.models.bag_rows), and
        # AdamW's first step, lr g / (|g| + eps), turns a rounding difference of a gradient
        # near eps into one of up to about 1e-6 of the weight.
        torch.testing.assert_close(sparse_model[name], value, rtol=1e-5,
                                   atol=2e-6 if name.endswith("bag.weight") else 1e-7)


def test_a_resumed_sparse_run_ends_as_an_uninterrupted_one(pairs: dict[str, Any],
                                                           tmp_path: Path) -> None:
    config = _config(pairs)
    whole = fit(config, tmp_path / "whole", progress=False)
    fit(config, tmp_path / "cut", progress=False, stop_at=4)
    resumed = fit(config, tmp_path / "cut", resume=True, progress=False)
    assert resumed.step == whole.step == 7
    for part in ("model", "objective"):
        left, right = _final(tmp_path / "whole", part), _final(tmp_path / "cut", part)
        assert all(torch.equal(left[k], right[k]) for k in left), part
    left = torch.load(tmp_path / "whole" / CHECKPOINT_FILE, weights_only=True)["optimizer"]
    right = torch.load(tmp_path / "cut" / CHECKPOINT_FILE, weights_only=True)["optimizer"]
    for i, state in left["state"].items():
        assert all(torch.equal(v, right["state"][i][k]) for k, v in state.items())
    assert _records(tmp_path / "whole") == _records(tmp_path / "cut")


@pytest.mark.parametrize("batched", [True, False])
def test_grouped_sparse_runs_equal_lone_runs(pairs: dict[str, Any], tmp_path: Path,
                                             batched: bool) -> None:
    configs = [_config(pairs, m=m, regime=regime)
               for regime, m in [("shared", 5), ("independent", 5), ("independent", 30)]]
    alone = [fit(c, tmp_path / f"alone{i}", progress=False) for i, c in enumerate(configs)]
    grouped = fit_group(configs, [tmp_path / f"group{i}" for i in range(len(configs))],
                        batched=batched)
    for i, (one, many) in enumerate(zip(alone, grouped, strict=True)):
        keys = {k for k in one.summary if not k.startswith("time/")}
        assert keys == {k for k in many.summary if not k.startswith("time/")}
        for key in keys:
            a, b = one.summary[key], many.summary[key]
            assert b == (pytest.approx(a, rel=1e-6, abs=1e-6) if isinstance(a, float) else a)
        left, right = _final(tmp_path / f"alone{i}"), _final(tmp_path / f"group{i}")
        for name, value in left.items():
            torch.testing.assert_close(right[name], value, rtol=1e-5, atol=1e-6)  # float32 rounding
    assert len({round(float(r.summary["train/loss"]), 9) for r in grouped}) > 1


def test_crl_train_with_model_sparse(pairs: dict[str, Any], tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    model = {k: v for k, v in MODEL.items() if k != "sparse"}
    config.write_text(json.dumps({"data": {**pairs, "num_train": 64, "val_fraction": 0.0},
                                  "model": model, "train": {"steps": 3, "batch_size": 16}}))
    out = tmp_path / "runs"
    result = CliRunner().invoke(app, ["train", str(config), "--out", str(out), "--no-progress",
                                      "--set", "model.sparse=true",
                                      "--set", "train.num_threads=1"])
    assert result.exit_code == 0, result.output
    (run_dir,) = [d for d in out.iterdir() if (d / "summary.json").is_file()]
    assert json.loads((run_dir / "config.json").read_text())["config"]["model"]["sparse"] is True
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 3
    bad = CliRunner().invoke(app, ["train", str(config), "--out", str(tmp_path / "bad"),
                                   "--set", "model.kind=frozen_minilm",
                                   "--set", "model.sparse=true"])
    assert bad.exit_code == 2 and "model.sparse: sparse must be false" in bad.output
