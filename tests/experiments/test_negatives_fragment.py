"""The answer as something to paste (crl.experiments.negatives.fragment): config sections that
``crl train``'s loader takes, the user's loss kept, a censored cell's bound marked, the in-batch
batch size with the memory gradient caching needs (crl.experiments.negatives.memory, its
constants checked against the benchmark files they come from, its D against built towers)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from crl.experiments.negatives.fragment import (
    closing_text,
    config_fragment,
    in_batch_fragment,
    loss_section,
)
from crl.experiments.negatives.laws import Recommendation
from crl.experiments.negatives.memory import (
    GIB,
    MINILM_STEP,
    PLAIN_FLOATS_PER_B2,
    TILED_FLOATS_PER_T2,
    cached_bytes,
    embedding_dim,
    gradcache_memory,
    scores_bytes,
    towers_bytes,
)
from crl.losses.tiled import DEFAULT_BLOCK_SIZE
from crl.train import TrainConfig, load_config

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
MINILM = {"kind": "transformer", "pretrained": None, "max_seq_length": 128, "freeze_layers": 0}


def _rec(regime: str, m: float | None, low: float = 0.0, target_n: int = 2000,
         n_used: int = 2000) -> Recommendation:
    return Recommendation(regime, target_n, "law" if n_used == target_n else "nearest cell", m,
                          low, math.inf, n_used, False, "planted")


def test_loss_section_keeps_what_the_user_set_and_drops_defaults() -> None:
    clip = TrainConfig.model_validate({"loss": {"name": "clip", "temperature": 0.2,
                                                "block_size": 256}}).loss.model_dump(mode="json")
    assert loss_section(clip) == {"name": "clip", "temperature": 0.2, "block_size": 256}
    gcl = TrainConfig.model_validate({"loss": {"name": "gcl", "gcl": {"gamma": 0.5}}}
                                     ).loss.model_dump(mode="json")
    assert loss_section(gcl) == {"name": "gcl", "temperature": 0.1, "gcl": {"gamma": 0.5}}


@pytest.mark.parametrize("regime", ["shared", "independent"])
def test_a_fragment_pastes_into_a_config_crl_train_loads(tmp_path: Path, regime: str) -> None:
    user = {"data": {"name": "synthetic"}, "model": {"kind": "mlp", "embed_dim": 8},
            "loss": {"name": "clip", "temperature": 0.2},
            "negatives": {"regime": "in_batch"}, "train": {"steps": 3, "batch_size": 16}}
    loss = TrainConfig.model_validate(user).loss.model_dump(mode="json")
    fragment = config_fragment(_rec(regime, 613.6), loss)
    assert fragment is not None and fragment["m"] == 614 and fragment["bound"] is None
    pasted = {**user, **yaml.safe_load(fragment["yaml"])}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(pasted))
    cfg = load_config(str(path))
    assert cfg.negatives.regime == regime and cfg.negatives.m == 614
    assert cfg.loss.name == "clip" and cfg.loss.temperature == 0.2  # the user's loss stays


def test_a_censored_cell_gives_its_bound_marked_and_an_open_one_gives_nothing() -> None:
    loss = {"name": "gcl", "temperature": 0.05}
    lower = config_fragment(_rec("shared", None, low=40.2), loss)
    assert lower is not None and lower["m"] == 40 and lower["bound"] == "lower"
    flat = Recommendation("shared", 2000, "nearest cell", None, 0.0, 12.4, 1000, False, "x")
    upper = config_fragment(flat, loss)  # flat from the smallest m: that many are enough
    assert upper is not None and upper["m"] == 12 and upper["bound"] == "upper"
    assert config_fragment(_rec("shared", None, low=0.0), loss) is None  # [0, inf): nothing
    batch = in_batch_fragment(_rec("shared", None, low=40.2), loss, 8, {"kind": "mlp"})
    assert batch is not None and batch["batch_size"] == 41 and batch["bound"] == "lower"
    text = closing_text({"shared": lower, "independent": upper}, batch, "x")
    assert "a lower bound: the curve still rises there" in text
    assert "an upper bound: the curve is already within the tolerance there" in text


def test_the_in_batch_answer_is_m_plus_one_and_gcl_becomes_an_in_batch_loss() -> None:
    batch = in_batch_fragment(_rec("shared", 613.6), {"name": "clip", "temperature": 0.1}, 384,
                              MINILM)
    assert batch is not None and batch["batch_size"] == 615
    assert batch["loss"] == {"name": "clip", "temperature": 0.1} and batch["loss_swapped"] is None
    assert batch["train"] == {"batch_size": 615, "micro_batch_size": 32}
    assert TrainConfig.model_validate(yaml.safe_load(batch["yaml"])).negatives.regime == "in_batch"
    swapped = in_batch_fragment(_rec("shared", 10.0), {"name": "gcl", "temperature": 0.05}, 8,
                                {"kind": "mlp"})
    assert swapped is not None and swapped["loss"] == {"name": "info_nce", "temperature": 0.05}
    assert swapped["loss_swapped"] == "gcl"
    assert swapped["train"] == {"batch_size": 11}  # no larger than a micro-batch: one pass


def test_the_closing_lines_parse_as_yaml_documents() -> None:
    loss = {"name": "clip", "temperature": 0.1}
    fragments = {r: config_fragment(_rec(r, m, target_n=2000, n_used=1000), loss)
                 for r, m in (("shared", 300.0), ("independent", 80.0))}
    batch = in_batch_fragment(_rec("shared", 300.0), loss, 384, MINILM)
    text = closing_text({r: f for r, f in fragments.items() if f is not None}, batch,
                        "12,000 samples per run at batch 128")
    docs = list(yaml.safe_load_all(text))
    assert [d["negatives"]["regime"] for d in docs] == ["shared", "independent", "in_batch"]
    assert docs[2]["train"]["batch_size"] == 301
    assert "measured at n = 1,000, where it is 30% of n" in text  # a count carried, its n named


def test_the_memory_model_comes_from_the_benchmarks() -> None:
    gradcache = json.loads((RESULTS / "gradcache.json").read_text())
    row = next(r for r in gradcache["rows"] if r["entry"] == "crl" and "crl_source" not in r)
    assert (row["batch_size"], row["micro_batch_size"], row["precision"]) == (
        MINILM_STEP.batch_size, MINILM_STEP.micro_batch_size, "fp32")
    assert row["peak_above_before_gib"] == MINILM_STEP.peak_growth_gib
    assert gradcache["max_seq_length"] == MINILM_STEP.max_seq_length
    loss = json.loads((RESULTS / "loss_memory.json").read_text())
    assert PLAIN_FLOATS_PER_B2 == pytest.approx(loss["plain_floats_per_b2"], abs=0.005)
    assert TILED_FLOATS_PER_T2 == pytest.approx(loss["tiled_floats_per_t2"], abs=0.005)
    # the parts add up to the measured step at the measured B
    measured = (cached_bytes(MINILM_STEP.batch_size, MINILM_STEP.dim)
                + scores_bytes(MINILM_STEP.batch_size) + towers_bytes())
    assert measured == pytest.approx(MINILM_STEP.peak_growth_gib * GIB, abs=2)


def test_the_memory_grows_with_the_batch_only_through_the_cache_and_the_scores() -> None:
    small, large = (gradcache_memory(b, 384, MINILM) for b in (64, 2048))
    assert small.towers == large.towers and small.total is not None and large.total is not None
    assert large.cached == 16 * 2048 * 384 and large.scores == round(4 * 8.84 * 2048 ** 2)
    assert large.total - small.total == (large.cached - small.cached) \
        + (large.scores - small.scores)
    tiled = gradcache_memory(10_000, 384, MINILM)  # tiles of DEFAULT_BLOCK_SIZE above 2,048
    assert tiled.scores == round(4 * 3.22 * DEFAULT_BLOCK_SIZE ** 2) < large.scores
    other = gradcache_memory(615, 128, {"kind": "embedding_bag"})
    assert other.towers is None and other.total is None and "measure yours" in other.note
    frozen = gradcache_memory(615, 384, {**MINILM, "freeze_layers": 4})
    assert "upper bound" in frozen.note


def _built_dim(model: dict[str, Any], data: dict[str, Any]) -> int:
    from crl.data import load_data
    from crl.models import build_model

    cfg = TrainConfig.model_validate({"data": data, "model": model})
    splits = load_data(cfg.data, progress=False)
    built = build_model(cfg.model, splits.info)
    rows = splits.train
    if splits.info.kind == "text":
        xa, _ = built.prepare(rows).eval_views()
        batch = xa[:2]
    else:
        batch = torch.stack([torch.as_tensor(rows[i][0]) for i in range(2)]).float()
    with torch.no_grad():
        return int(built.encode_a(batch).shape[-1])


@pytest.mark.parametrize("model", [{"kind": "linear", "embed_dim": 12}, {"kind": "mlp"},
                                   {"kind": "mlp", "embed_dim": 20, "head": "none"}])
def test_embedding_dim_is_the_built_towers_width(model: dict[str, Any]) -> None:
    data = {"name": "synthetic", "synthetic": {"num_samples": 64, "dim": 6}}
    assert embedding_dim(model, model["kind"]) == _built_dim(model, data)


def test_embedding_dim_of_a_transformer_is_its_hidden_width(tmp_path: Path,
                                                             tiny_bert: Path) -> None:
    lines = [json.dumps({"a": f"add {i}", "b": f"def add_{i}(): return {i}"}) for i in range(20)]
    (tmp_path / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    data = {"name": "files", "files": {"path": str(tmp_path / "pairs.jsonl")}}
    model = {"kind": "transformer", "pretrained": str(tiny_bert), "max_seq_length": 16}
    assert embedding_dim(model, "transformer") == _built_dim(model, data) == 32
    assert embedding_dim({**model, "head": "linear", "embed_dim": 8}, "transformer") == 8
