"""A group's GCL losses in one computation (crl.losses.gcl_group) leave the group's runs as
they were with each run's own objective: the same summaries, metrics records, weights and
``u`` estimates, bit for bit, on text through an embedding bag (the quick study's towers) with
shared, independent and in-batch negatives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import crl.train.grouped
from crl.experiments.negatives.grid import GRIDS, default_run_config
from crl.rundir import CHECKPOINT_FILE, METRICS_FILE
from crl.train import validate_config
from crl.train.grouped import fit_group

WORDS = ["sum", "list", "parse", "file", "open", "read", "sort", "key", "value", "map"]
MODEL = {"kind": "embedding_bag", "embed_dim": 16, "token_dim": 8, "head": "linear",
         "max_tokens": 16, "sparse": True}


def _configs(tmp_path: Path) -> list[Any]:
    data = tmp_path / "pairs.jsonl"
    rows = [{"a": f"{WORDS[i % 10]} the {WORDS[(i * 3) % 10]} item {i}",
             "b": f"def f{i}(): return {WORDS[i % 10]}_{WORDS[(i * 7) % 10]}"}
            for i in range(120)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    section = {"name": "files", "files": {"path": str(data)}}
    out = []
    for regime, m in [("shared", 3), ("independent", 3), ("independent", 20), ("shared", 10)]:
        config = default_run_config(section, MODEL, GRIDS["synthetic"]["smoke"], n=64, m=m,
                                    regime=regime, seed=1, temperature=0.1, probe=False,
                                    device=None)
        config["train"].update(max_samples=448, log_every=3, checkpoint_every=4, num_threads=1)
        out.append(validate_config(config))
    in_batch = out[0].model_copy(deep=True)
    in_batch.negatives.regime, in_batch.negatives.m = "in_batch", None
    return [*out, in_batch]


def _trained(configs: list[Any], folder: Path) -> list[tuple[Any, list[str], dict[str, Any]]]:
    results = fit_group(configs, [folder / f"run{i}" for i in range(len(configs))])
    return [({k: v for k, v in r.summary.items() if not k.startswith("time/")},
             (folder / f"run{i}" / METRICS_FILE).read_text().splitlines(),
             torch.load(folder / f"run{i}" / CHECKPOINT_FILE, weights_only=True))
            for i, r in enumerate(results)]


def test_group_summaries_unchanged_by_the_grouped_gcl(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    configs = _configs(tmp_path)
    chosen = []
    real = crl.train.grouped.grouped_gcl

    def spy(*args: Any) -> Any:
        chosen.append(real(*args))
        return chosen[-1]

    monkeypatch.setattr(crl.train.grouped, "grouped_gcl", spy)
    together = _trained(configs, tmp_path / "together")
    assert chosen and chosen[0] is not None  # the group's losses were computed together
    monkeypatch.setattr(crl.train.grouped, "grouped_gcl", lambda *args: None)
    alone = _trained(configs, tmp_path / "alone")  # each run's own objective
    for (summary, records, checkpoint), (want, want_records, want_checkpoint) in zip(
            together, alone, strict=True):
        assert summary == want
        assert records == want_records  # every logged loss, step by step
        for part in ("model", "objective"):  # weights, and GCL's u estimates
            assert checkpoint[part].keys() == want_checkpoint[part].keys()
            for name, value in want_checkpoint[part].items():
                assert torch.equal(checkpoint[part][name].nan_to_num(7.0),
                                   value.nan_to_num(7.0)), (part, name)
    assert len({s["train/loss"] for s, _, _ in together}) == len(configs)  # runs differ
