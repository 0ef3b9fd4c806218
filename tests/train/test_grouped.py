"""Grouped training (crl.train.fit_group) equals one fit() per run: the same summaries to 1e-6
and the same metrics records, GCL state and checkpoints (to float32 rounding), with shared and
independent negative sets, for GCL and InfoNCE, on vector data (MLP towers) and on text (an
embedding bag)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

from crl.errors import CrlValueError
from crl.experiments.negatives.grid import GRIDS, default_run_config, model_section
from crl.negatives import NegativeSets, SetFamily
from crl.rundir import CHECKPOINT_FILE, METRICS_FILE
from crl.train import fit, validate_config
from crl.train.grouped import GroupingError, fit_group, group_key

SYNTHETIC = {"name": "synthetic", "synthetic": {"model": "correlated_gaussian", "dim": 8,
                                                "rho": 0.6, "num_samples": 400}}
NEGATIVES = [("shared", 5), ("independent", 5), ("independent", 30)]


def _configs(data: dict[str, Any], model: dict[str, Any], loss: str = "gcl",
             n: int = 64) -> list[Any]:
    grid = GRIDS["synthetic"]["smoke"]
    out = []
    for regime, m in NEGATIVES:
        config = default_run_config(data, model, grid, n=n, m=m, regime=regime, seed=1,
                                    temperature=0.1, probe=False, device=None)
        config["train"].update(max_samples=448, log_every=3, checkpoint_every=4)
        config["train"]["num_threads"] = 1
        if loss != "gcl":
            config["loss"] = {"name": loss, "temperature": 0.1}
        out.append(validate_config(config))
    return out


def _records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / METRICS_FILE).read_text().splitlines()
    return [json.loads(line) for line in lines]


def _close(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` with their floats to float32 rounding: a stacked (vmap) product may take
    another kernel than one run's, and which one depends on the CPU (bit for bit on some, a few
    ulps apart on others)."""
    return [{k: pytest.approx(v, rel=1e-5, abs=1e-7) if isinstance(v, float) else v
             for k, v in r.items()} for r in records]


def _check_same(configs: list[Any], tmp_path: Path, *, batched: bool = True) -> None:
    alone = [fit(c, tmp_path / f"alone{i}", progress=False) for i, c in enumerate(configs)]
    grouped = fit_group(configs, [tmp_path / f"group{i}" for i in range(len(configs))],
                        batched=batched)
    for i, (one, many) in enumerate(zip(alone, grouped, strict=True)):
        assert many.finished and many.step == one.step
        keys = {k for k in one.summary if not k.startswith("time/")}
        assert keys == {k for k in many.summary if not k.startswith("time/")}
        for key in keys:
            a, b = one.summary[key], many.summary[key]
            if isinstance(a, float):
                assert b == pytest.approx(a, rel=1e-6, abs=1e-6), key
            else:
                assert a == b, key
        assert _records(tmp_path / f"group{i}") == _close(_records(tmp_path / f"alone{i}"))
        left = torch.load(tmp_path / f"alone{i}" / CHECKPOINT_FILE, weights_only=True)
        right = torch.load(tmp_path / f"group{i}" / CHECKPOINT_FILE, weights_only=True)
        assert torch.equal(left["rng"]["torch"], right["rng"]["torch"])
        for part in ("model", "objective"):  # weights and GCL's u estimates
            for name, value in left[part].items():
                # float32 rounding carried over the steps (a few 1e-6 at most, measured)
                assert torch.allclose(value, right[part][name], rtol=1e-5, atol=1e-5,
                                      equal_nan=True), (part, name)
    # the runs differ from each other: the negatives changed what they learned
    assert len({round(float(r.summary["train/loss"]), 9) for r in grouped}) > 1


LINEAR = {"kind": "linear", "embed_dim": 16}


@pytest.mark.parametrize("loss", ["gcl", "info_nce"])
def test_grouped_equals_fit_on_vectors(loss: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import crl.train.grouped as grouped

    made: list[SetFamily] = []
    real = grouped.share_ranks

    def recorded(sets: Iterable[NegativeSets]) -> list[SetFamily]:
        out = real(sets)
        made.extend(out)
        return out

    monkeypatch.setattr(grouped, "share_ranks", recorded)
    _check_same(_configs(SYNTHETIC, LINEAR, loss), tmp_path)
    # the two independent runs ranked each batch once (the shared one has a family of its own)
    assert [(family.regime, family.sizes) for family in made] == [("independent", (5, 30))]


def test_separate_towers_with_layer_norm_equal_fit(tmp_path: Path) -> None:
    _check_same(_configs(SYNTHETIC, model_section("synthetic", None)), tmp_path, batched=False)


def test_towers_with_layer_norm_are_not_batched(tmp_path: Path) -> None:
    configs = _configs(SYNTHETIC, model_section("synthetic", None))[:2]  # an MLP: layer norm
    with pytest.raises(GroupingError, match="LayerNorm"):
        fit_group(configs, [tmp_path / "a", tmp_path / "b"])
    assert not (tmp_path / "a").exists()  # refused before anything was written


@pytest.mark.parametrize("batched", [True, False])
def test_grouped_equals_fit_on_text_embedding_bag(batched: bool, tmp_path: Path) -> None:
    data = tmp_path / "pairs.jsonl"
    words = ["sum", "list", "parse", "file", "open", "read", "sort", "key", "value", "map"]
    rows = [{"a": f"{words[i % 10]} the {words[(i * 3) % 10]} item {i}",
             "b": f"def f{i}(): return {words[i % 10]}_{words[(i * 7) % 10]}"} for i in range(120)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    model = {"kind": "embedding_bag", "embed_dim": 16, "token_dim": 8, "head": "linear",
             "max_tokens": 16}
    section = {"name": "files", "files": {"path": str(data)}}
    _check_same(_configs(section, model, n=64), tmp_path, batched=batched)


def test_group_key_and_bad_groups(tmp_path: Path) -> None:
    configs = _configs(SYNTHETIC, LINEAR)
    assert len({group_key(c) for c in configs}) == 1
    other = _configs(SYNTHETIC, LINEAR, n=96)[0]
    assert group_key(other) != group_key(configs[0])
    with pytest.raises(CrlValueError, match="agree on everything"):
        fit_group([configs[0], other], [tmp_path / "a", tmp_path / "b"])
    with pytest.raises(CrlValueError, match="own run directory"):
        fit_group(configs[:2], [tmp_path / "a", tmp_path / "a"])
    cached = configs[0].model_copy(deep=True)
    cached.train.micro_batch_size = 4
    assert group_key(cached) is None


def test_a_group_stopped_midway_resumes_one_run_at_a_time(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from crl.train.steps import GroupStep

    configs = _configs(SYNTHETIC, LINEAR)  # 7 steps, checkpoints at step 4
    alone = [fit(c, tmp_path / f"alone{i}", progress=False) for i, c in enumerate(configs)]
    steps = 0
    real = GroupStep.__call__

    def crash_at_six(*args: Any) -> Any:
        nonlocal steps
        steps += 1
        if steps == 6:
            raise RuntimeError("killed")
        return real(*args)

    monkeypatch.setattr(GroupStep, "__call__", crash_at_six)
    dirs = [tmp_path / f"group{i}" for i in range(len(configs))]
    with pytest.raises(RuntimeError, match="killed"):
        fit_group(configs, dirs)
    for i, (config, run_dir) in enumerate(zip(configs, dirs, strict=True)):
        resumed = fit(config, run_dir, resume=True, progress=False)
        assert _records(run_dir) == _close(_records(tmp_path / f"alone{i}"))
        assert {k: v for k, v in resumed.summary.items() if not k.startswith("time/")} == \
            _close([{k: v for k, v in alone[i].summary.items() if not k.startswith("time/")}])[0]
