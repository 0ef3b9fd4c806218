"""The statistics of ``benchmarks/quality.py --minilm``: per-pair hits with crl's tie rule, and
paired differences between entries scored on the same test pairs."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from crl.eval import retrieval_metrics

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"crl_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_hits_at_1_agree_with_retrieval_metrics_and_count_ties_against() -> None:
    worker = _load("quality_minilm")
    za = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    zb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    hits = worker.hits_at_1(za, zb)
    # query 0 ranks b0 (1.0) first; query 2 scores b0 at 1.0 above its own 0.6; query 1 wins
    assert hits["x2y"] == "110"
    # ties: a0 and a2 are equal, so b0 has two candidates at its positive's score
    assert hits["y2x"] == "010"
    torch.manual_seed(0)
    a, b = torch.randn(50, 8), torch.randn(50, 8)
    b = a + 0.8 * b
    hits = worker.hits_at_1(a, b)
    metrics = retrieval_metrics(a, b, ks=(1,))
    for key in ("x2y", "y2x"):
        assert hits[key].count("1") / 50 == pytest.approx(metrics[f"retrieval/{key}_recall@1"])


def test_paired_difference_is_the_mean_and_sd_of_per_pair_differences() -> None:
    quality = _load("quality")
    ours = [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    theirs = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    out = quality.paired_difference(ours, theirs)
    d = [0, 1, 0, 0, -1, 1, 0, 0]
    mean = sum(d) / 8
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 7)
    assert out["difference"] == pytest.approx(0.125)
    assert out["se"] == pytest.approx(sd / math.sqrt(8))
    assert out["ci95"] == pytest.approx([mean - 1.96 * sd / math.sqrt(8),
                                         mean + 1.96 * sd / math.sqrt(8)])
    assert out["disagree"] == pytest.approx(3 / 8)
    with pytest.raises(ValueError, match="different test sets"):
        quality.paired_difference(ours, theirs[:-1])


def test_goals_are_paired_and_say_whether_non_inferiority_is_shown() -> None:
    quality = _load("quality")
    n = 400
    base = "1" * 300 + "0" * 100
    close = "1" * 298 + "0" * 102  # 2 fewer hits: -0.005
    entries = {name: {"hits@1": {"x2y": hits, "y2x": hits},
                      "metrics": {f"retrieval/{k}_recall@1": hits.count("1") / n
                                  for k in ("x2y", "y2x")},
                      "x2y_recall@1_se": 0.02, "y2x_recall@1_se": 0.02}
               for name, hits in (("crl_clip_b64", base), ("crl_gcl_b16", close),
                                  ("sentence_transformers", base))}
    goals = quality.minilm_comparison(entries)["goals (paired differences; met: >= -0.01)"]
    gcl = goals["gcl_b16_vs_crl_b64/mean"]
    assert gcl["difference"] == pytest.approx(-0.005) and gcl["met"]
    assert gcl["shown_non_inferior"] == (gcl["ci95"][0] >= -0.01)
    same = goals["crl_b64_vs_st/x2y"]
    assert same["difference"] == 0 and same["se"] == 0 and same["shown_non_inferior"]
