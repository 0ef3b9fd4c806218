"""Quality benchmark of the trainer: is contrastive pre-training with crl any good?

1. ``digits``: SimCLR pre-training from scratch (preset ``digits-simclr``), then a linear probe
   and a weighted kNN on the frozen representation, next to the same probes on raw pixels, with
   the CPU time of each. Targets: linear probe >= 0.93, kNN >= 0.90 held-out accuracy.
2. ``pycode``: the trained dual encoder (preset ``pycode-clip``: MLP heads over frozen
   all-MiniLM-L6-v2 features, CLIP loss) against frozen MiniLM's plain cosine on the same
   held-out docstring-to-code pairs (recall@1, docstring -> code). Target: +20% relative.

Writes ``benchmarks/results/quality.json``. Run from the repository root:

    .venv/bin/python benchmarks/quality.py [--skip-pycode] [--threads 1] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from crl.data import load_data
from crl.env import environment_info
from crl.eval import knn_probe, linear_probe, retrieval_metrics
from crl.models import build_model
from crl.models.config import ModelConfig
from crl.rundir import write_json
from crl.train import build_run, config_hash, fit, load_config
from crl.train.evaluation import evaluate

RESULTS = Path(__file__).resolve().parent / "results" / "quality.json"


def _cpu() -> float:
    """CPU seconds of this process (all threads)."""
    return time.process_time()


def digits(out: Path, threads: int, overrides: list[str]) -> dict[str, Any]:
    """SimCLR on digits vs probes on raw pixels."""
    cfg = load_config("digits-simclr", [f"train.num_threads={threads}", *overrides])
    cpu0, wall0 = _cpu(), time.perf_counter()
    result = fit(cfg, out / f"digits-simclr-{config_hash(cfg)}", progress=False)
    cpu_train, wall_train = _cpu() - cpu0, time.perf_counter() - wall0
    summary = result.summary

    # The raw-pixel baseline on exactly the same train/test split (clean images, flattened).
    splits = load_data(cfg.data)
    train_x = splits.train.eval_views()[0].flatten(1)
    test_x = splits.test.eval_views()[0].flatten(1)
    train_y, test_y = splits.train.labels, splits.test.labels
    assert train_y is not None and test_y is not None
    cpu0 = _cpu()
    raw_linear = linear_probe(train_x, train_y, test_x, test_y)
    raw_knn = knn_probe(train_x, train_y, test_x, test_y, k=cfg.eval.knn_k)
    cpu_raw = _cpu() - cpu0

    # The same encoder before any training: how much of the probe is the architecture's?
    untrained = build_run(cfg, torch.device("cpu"))
    init = evaluate(untrained.model, untrained.test_ds, cfg.eval, temperature=1.0,
                    train_split=untrained.train_ds)
    return {
        "config": "digits-simclr", "overrides": overrides, "run_id": config_hash(cfg),
        "steps": result.step,
        "num_train": len(splits.train), "num_test": len(splits.test),
        "contrastive": {
            "linear_acc": summary["probe/linear_acc"],
            "linear_balanced_acc": summary["probe/linear_balanced_acc"],
            "knn_acc": summary["probe/knn_acc"],
            "knn_balanced_acc": summary["probe/knn_balanced_acc"],
            "cpu_seconds": cpu_train, "wall_seconds": wall_train, "threads": threads,
        },
        "random_init": {k.removeprefix("probe/"): v for k, v in init.items()
                        if k.startswith("probe/")},
        "raw_pixels": {
            "linear_acc": raw_linear.accuracy, "linear_balanced_acc": raw_linear.balanced_accuracy,
            "knn_acc": raw_knn.accuracy, "knn_balanced_acc": raw_knn.balanced_accuracy,
            "cpu_seconds": cpu_raw,
        },
        "targets": {"linear_acc": 0.93, "knn_acc": 0.90},
        "met": summary["probe/linear_acc"] >= 0.93 and summary["probe/knn_acc"] >= 0.90,
    }


def pycode(out: Path, threads: int, overrides: list[str]) -> dict[str, Any]:
    """The trained dual encoder vs frozen MiniLM cosine, held-out docstring -> code recall@1."""
    cfg = load_config("pycode-clip", [f"train.num_threads={threads}", *overrides])
    cpu0, wall0 = _cpu(), time.perf_counter()
    result = fit(cfg, out / f"pycode-clip-{config_hash(cfg)}", progress=False)
    cpu_train, wall_train = _cpu() - cpu0, time.perf_counter() - wall0
    summary = result.summary

    # Frozen MiniLM, no head: the plain cosine of its sentence embeddings, same test split.
    splits = load_data(cfg.data, progress=False)
    baseline_cfg = ModelConfig(kind="frozen_minilm", head="none", embed_dim=384,
                               cache_dir=cfg.model.cache_dir)
    torch.manual_seed(0)
    frozen = build_model(baseline_cfg, splits.info)
    test = frozen.prepare(splits.test)
    xa, xb = test.eval_views()
    with torch.no_grad():
        za, zb = frozen.encode_a(xa), frozen.encode_b(xb)
    base = retrieval_metrics(za, zb, ks=cfg.eval.ks)
    trained = summary["retrieval/x2y_recall@1"]
    frozen_r1 = base["retrieval/x2y_recall@1"]
    return {
        "config": "pycode-clip", "overrides": overrides, "run_id": config_hash(cfg),
        "steps": result.step,
        "num_train": len(splits.train), "num_test": len(splits.test),
        "provenance": splits.info.provenance,
        "trained": {k: v for k, v in summary.items() if k.startswith("retrieval/")},
        "frozen_minilm": base,
        "doc2code_recall@1": {"trained": trained, "frozen_minilm": frozen_r1,
                              "relative_improvement": (trained - frozen_r1) / frozen_r1},
        "cpu_seconds": cpu_train, "wall_seconds": wall_train, "threads": threads,
        "target_relative_improvement": 0.20,
        "met": (trained - frozen_r1) / frozen_r1 >= 0.20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-digits", action="store_true")
    parser.add_argument("--skip-pycode", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--digits-set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--pycode-set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--runs", type=Path, default=None,
                        help="where the run directories go (default: a temporary directory)")
    args = parser.parse_args()
    out = args.runs or Path(tempfile.mkdtemp(prefix="crl-quality-"))
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results["environment"] = environment_info()
    results["environment"]["cpu_count"] = os.cpu_count()
    results["environment"]["load_average_before"] = os.getloadavg()
    if not args.skip_digits:
        results["digits"] = digits(out, args.threads, args.digits_set)
        print(json.dumps(results["digits"], indent=2))
        write_json(RESULTS, results)
    if not args.skip_pycode:
        results["pycode"] = pycode(out, args.threads, args.pycode_set)
        print(json.dumps({k: v for k, v in results["pycode"].items() if k != "provenance"},
                         indent=2))
        write_json(RESULTS, results)
    results["environment"]["load_average_after"] = os.getloadavg()
    write_json(RESULTS, results)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
