"""Quality benchmark of the trainer: is contrastive pre-training with crl any good?

1. ``digits``: SimCLR pre-training from scratch (preset ``digits-simclr``), then a linear probe
   and a weighted kNN on the frozen representation, next to the same probes on raw pixels, with
   the CPU time of each. Targets: linear probe >= 0.93, kNN >= 0.90 held-out accuracy.
2. ``pycode``: the trained dual encoder (preset ``pycode-clip``: MLP heads over frozen
   all-MiniLM-L6-v2 features, CLIP loss) against frozen MiniLM's plain cosine on the same
   held-out docstring-to-code pairs (recall@1, docstring -> code). Target: +20% relative.

3. ``--minilm``: all-MiniLM-L6-v2 fine-tuned end to end on pycode, crl against
   sentence-transformers' own recipe, each entry in its own process
   (``benchmarks/quality_minilm.py``): the frozen model, sentence-transformers'
   ``MultipleNegativesRankingLoss`` at batch 64, crl's CLIP loss at batch 64 and crl's GCL at
   batch 16, one pass over the same first ``--train-pairs`` training pairs. Goals: crl at batch
   64 within 0.01 of sentence-transformers (or better), GCL at 16 within 0.01 of crl at 64.
   Writes ``OUT/quality_minilm.json``.

Writes ``OUT/quality.json``; ``--out`` defaults to ``runs/bench`` (the tracked results under
``benchmarks/results`` change only when ``--out benchmarks/results`` names them). Run from the
repository root:

    .venv/bin/python benchmarks/quality.py [--skip-pycode] [--threads 1] [--set key=value ...]
    .venv/bin/python benchmarks/quality.py --skip-digits --skip-pycode --minilm \
        [--minilm-entries frozen,sentence_transformers] [--train-pairs 2560] [--test-pairs 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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

DEFAULT_OUT = Path("runs") / "bench"
MINILM_WORKER = Path(__file__).resolve().parent / "quality_minilm.py"
MINILM_ENTRIES = ("frozen", "sentence_transformers", "crl_clip_b64", "crl_gcl_b16")


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


def _merge_minilm(path: Path, entry: str, value: dict[str, Any]) -> dict[str, Any]:
    """Add one entry to ``quality_minilm.json`` at ``path`` as it is now (drivers may run side by
    side)."""
    results: dict[str, Any] = (json.loads(path.read_text())
                               if path.exists() else {"entries": {}})
    results["entries"][entry] = value
    results["comparison"] = minilm_comparison(results["entries"])
    write_json(path, results)
    return results


def minilm(entries: list[str], train_pairs: int, test_pairs: int, threads: int,
           out_dir: Path) -> dict[str, Any]:
    """Run each MiniLM entry in a fresh process; merge it into ``out_dir/quality_minilm.json``."""
    results: dict[str, Any] = {}
    for entry in entries:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        proc = subprocess.run([sys.executable, str(MINILM_WORKER), entry, "--train-pairs",
                               str(train_pairs), "--test-pairs", str(test_pairs),
                               "--threads", str(threads)],
                              capture_output=True, text=True, check=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = " | ".join(proc.stderr.strip().splitlines()[-4:])
            value = {"error": f"exit {proc.returncode}: {tail}", "started_utc": started}
        else:
            value = {**json.loads(lines[-1]), "started_utc": started,
                     "environment": {**environment_info(), "cpu_count": os.cpu_count()}}
        print(entry, json.dumps(value))
        results = _merge_minilm(out_dir / "quality_minilm.json", entry, value)
    return results


def paired_difference(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    """Recall@1 of ``ours`` minus ``theirs`` on the same test pairs (per-pair hits,
    :func:`quality_minilm.hits_at_1`), with the paired standard error ``sd(d_i) / sqrt(N)`` of
    the per-pair differences ``d_i`` and its normal 95% interval; ``disagree`` is the share of
    pairs where the entries differ (only those move the difference)."""
    if len(ours) != len(theirs):
        raise ValueError(f"entries scored different test sets ({len(ours)} vs {len(theirs)})")
    d = [x - y for x, y in zip(ours, theirs, strict=True)]
    n = len(d)
    mean = sum(d) / n
    var = sum((v - mean) ** 2 for v in d) / (n - 1)
    se = (var / n) ** 0.5
    return {"difference": mean, "se": se, "ci95": [mean - 1.96 * se, mean + 1.96 * se],
            "disagree": sum(v != 0 for v in d) / n, "num_test": n}


def minilm_comparison(entries: dict[str, Any], margin: float = 0.01) -> dict[str, Any]:
    """Recall@1 both ways per entry (binomial SE), and the two goals as paired differences on
    the same test pairs (:func:`paired_difference`), per direction and for the mean of both
    directions. A goal is ``met`` when the difference is at least ``-margin``;
    ``shown_non_inferior`` when its whole 95% interval is (a one-sided test at 2.5%)."""
    def recall(name: str, key: str) -> tuple[float, float] | None:
        entry = entries.get(name, {})
        value = entry.get("metrics", {}).get(f"retrieval/{key}_recall@1")
        return None if value is None else (value, entry[f"{key}_recall@1_se"])

    table = {name: {k: recall(name, k) for k in ("x2y", "y2x")} for name in entries}
    goals: dict[str, Any] = {}
    for goal, (ours, theirs) in {"crl_b64_vs_st": ("crl_clip_b64", "sentence_transformers"),
                                 "gcl_b16_vs_crl_b64": ("crl_gcl_b16", "crl_clip_b64"),
                                 "gcl_b16_vs_clip_b16": ("crl_gcl_b16", "crl_clip_b16"),
                                 "gcl_b16_tau07_vs_crl_b64": ("crl_gcl_b16_tau07",
                                                              "crl_clip_b64"),
                                 "gcl_pos_b16_vs_crl_b64": ("crl_gcl_pos_b16",
                                                            "crl_clip_b64"),
                                 "matryoshka_b64_vs_crl_b64": ("crl_clip_b64_matryoshka",
                                                               "crl_clip_b64"),
                                 "mined_b16_vs_clip_b16": ("crl_clip_b16_mined", "crl_clip_b16"),
                                 "guide_b16_vs_clip_b16": ("crl_clip_b16_guide", "crl_clip_b16"),
                                 "matryoshka_b16_vs_clip_b16": ("crl_clip_b16_matryoshka",
                                                                "crl_clip_b16")}.items():
        a, b = entries.get(ours, {}).get("hits@1"), entries.get(theirs, {}).get("hits@1")
        if a is None or b is None:
            continue
        hits = {k: ([float(c) for c in a[k]], [float(c) for c in b[k]]) for k in ("x2y", "y2x")}
        both = {k: paired_difference(*hits[k]) for k in ("x2y", "y2x")}
        # both directions: the per-pair mean of the two hits (the study's recall@1)
        mean = [[(x + y) / 2 for x, y in zip(hits["x2y"][i], hits["y2x"][i], strict=True)]
                for i in (0, 1)]
        both["mean"] = paired_difference(mean[0], mean[1])
        for key, value in both.items():
            goals[f"{goal}/{key}"] = {**value, "met": value["difference"] >= -margin,
                                      "shown_non_inferior": value["ci95"][0] >= -margin}
    return {"recall@1 (value, se)": table,
            f"goals (paired differences; met: >= -{margin:g})": goals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-digits", action="store_true")
    parser.add_argument("--skip-pycode", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--digits-set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--pycode-set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--minilm", action="store_true",
                        help="fine-tune all-MiniLM-L6-v2 with crl and sentence-transformers")
    parser.add_argument("--minilm-entries", default=",".join(MINILM_ENTRIES))
    parser.add_argument("--train-pairs", type=int, default=2560,
                        help="the fixed training subset of every MiniLM entry")
    parser.add_argument("--test-pairs", type=int, default=2000,
                        help="the fixed test subset (the first pairs of the test split)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="directory of the results files (default: runs/bench)")
    parser.add_argument("--runs", type=Path, default=None,
                        help="where the run directories go (default: a temporary directory)")
    args = parser.parse_args()
    out = args.runs or Path(tempfile.mkdtemp(prefix="crl-quality-"))
    args.out.mkdir(parents=True, exist_ok=True)
    results_file = args.out / "quality.json"
    results: dict[str, Any] = (json.loads(results_file.read_text()) if results_file.exists()
                               else {})
    results["environment"] = environment_info()
    results["environment"]["cpu_count"] = os.cpu_count()
    results["environment"]["load_average_before"] = os.getloadavg()
    if not args.skip_digits:
        results["digits"] = digits(out, args.threads, args.digits_set)
        print(json.dumps(results["digits"], indent=2))
        write_json(results_file, results)
    if not args.skip_pycode:
        results["pycode"] = pycode(out, args.threads, args.pycode_set)
        print(json.dumps({k: v for k, v in results["pycode"].items() if k != "provenance"},
                         indent=2))
        write_json(results_file, results)
    if args.minilm:
        minilm(args.minilm_entries.split(","), args.train_pairs, args.test_pairs,
               args.threads, args.out)
        print(f"wrote {args.out / 'quality_minilm.json'}")
    if args.skip_digits and args.skip_pycode:
        return
    results["environment"]["load_average_after"] = os.getloadavg()
    write_json(results_file, results)
    print(f"wrote {results_file}")


if __name__ == "__main__":
    main()
