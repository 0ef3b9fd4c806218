"""A negatives-study run on all-MiniLM-L6-v2 with its bottom 4 layers frozen and cached (the top
2 and nothing else trained) against a full fine-tune of the same run: CPU seconds per run and
the study's metric (recall@1, the mean of both directions), side by side.

The data: the machine's short against long descriptions (:func:`crl.data.descriptions.
write_description_pairs`: dpkg's installed packages, then manual pages), 80/20 split, columns
``short`` -> ``long``. The run: the negatives study's own run config of one grid point of its
quick preset for a transformer (``NegativesStudy("quick", config=...)``: n = 2,048, m = 20% of n,
independent negative sets, 512 samples at batch 32; the config's loss ``clip``, lr 1e-4,
``max_seq_length`` 128), one torch thread (a study worker's share with ``--workers 2`` on 2
cores). Entries, in one process:

- ``frozen_cold``: ``freeze_layers: 4``, seed 0, the first run of the process: it fills the
  cache of the frozen part (every text of its train and test splits once);
- ``frozen_warm``: the same at seed 1: what every later run of a study's worker costs;
- ``full``: ``freeze_layers: 0`` (every layer trained), seeds 0 and 1;
- ``cache``: the states cached (texts, MiB), and what writing and reading them back as one
  float32 ``.npy`` costs against computing them (the fill), to judge an on-disk cache.

Prints and writes ``benchmarks/results/frozen.json``:

    PYTHONPATH=src .venv/bin/python benchmarks/frozen.py
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
import yaml

from crl.bench._measure import machine_state
from crl.data.descriptions import write_description_pairs
from crl.experiments.metrics import metric_value
from crl.experiments.negatives import NegativesStudy
from crl.models import frozen_cache
from crl.train import fit, validate_config

RESULTS = Path(__file__).parent / "results" / "frozen.json"
FREEZE = 4
N, FRACTION = 2048, 0.2


def user_config(data: Path, freeze: int) -> dict[str, Any]:
    """The user's MiniLM config (``docs/results/negatives-minilm-quick/minilm.yaml``'s)."""
    return {"data": {"name": "files", "val_fraction": 0.0,
                     "files": {"path": str(data), "columns": {"a": "short", "b": "long"}}},
            "model": {"kind": "transformer", "max_seq_length": 128, "freeze_layers": freeze},
            "loss": {"name": "clip"}, "optim": {"lr": 1e-4},
            "train": {"batch_size": 32, "num_threads": 1}, "eval": {"probe": False}}


def study_run(tmp: Path, data: Path, freeze: int, seed: int) -> dict[str, Any]:
    """The quick study's run config at (n, m, independent, ``seed``) for ``freeze``."""
    path = tmp / f"minilm-{freeze}.yaml"
    path.write_text(yaml.safe_dump(user_config(data, freeze)))
    study = NegativesStudy("quick", config=str(path))
    m = max(1, round(FRACTION * N))
    [spec] = [s for s in study.runs() if (s.tags["n"], s.tags["m"], s.tags["regime"],
                                          s.tags["seed"]) == (N, m, "independent", seed)]
    return spec.config


def one(tmp: Path, data: Path, freeze: int, seed: int, name: str) -> dict[str, Any]:
    config = validate_config(study_run(tmp, data, freeze, seed), origin=name)
    start, wall = time.process_time(), time.perf_counter()
    summary = fit(config, tmp / name, progress=False).summary
    cpu, took = time.process_time() - start, time.perf_counter() - wall
    out = {"entry": name, "freeze_layers": freeze, "seed": seed, "cpu_s": round(cpu, 1),
           "wall_s": round(took, 1), "run_cpu_s": round(float(summary["time/cpu_s"]), 1),
           "steps": summary["step"], "recall@1": metric_value(summary, "recall@1"),
           "x2y_recall@1": summary["retrieval/x2y_recall@1"],
           "y2x_recall@1": summary["retrieval/y2x_recall@1"], "load_after": os.getloadavg()}
    print(json.dumps(out), flush=True)
    return out


def cache_io(tmp: Path, fill_cpu_s: float) -> dict[str, Any]:
    """The process's cache written to and read back from one float32 ``.npy`` (states
    concatenated, with their lengths), timed against the fill."""
    outputs = frozen_cache.shared_outputs((str(_minilm_dir()), FREEZE))
    states = list(outputs._states.values())
    start = time.perf_counter()
    flat = torch.cat(states).numpy()  # (tokens, hidden)
    np.save(tmp / "states.npy", flat)
    np.save(tmp / "lengths.npy", np.array([len(s) for s in states]))
    write = time.perf_counter() - start
    start = time.perf_counter()
    back = torch.from_numpy(np.load(tmp / "states.npy"))
    lengths = np.load(tmp / "lengths.npy").tolist()
    _ = list(torch.split(back, lengths))
    read = time.perf_counter() - start
    return {"texts": len(outputs), "computed": outputs.computed,
            "mib": round(outputs.nbytes() / 2**20, 1), "write_s": round(write, 2),
            "read_s": round(read, 2), "fill_cpu_s_estimate": round(fill_cpu_s, 1)}


def _minilm_dir() -> Path:
    from crl.models.transformer import resolve_model_dir

    return resolve_model_dir(None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None,
                        help="a short/long description .jsonl (default: built from this machine)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        data = args.data or tmp / "descriptions.jsonl"
        pairs = sum(1 for _ in data.open()) if args.data else write_description_pairs(data)
        before = machine_state()
        rows = [one(tmp, data, FREEZE, 0, "frozen_cold"), one(tmp, data, FREEZE, 1, "frozen_warm")]
        cache = cache_io(tmp, rows[0]["run_cpu_s"] - rows[1]["run_cpu_s"])
        rows += [one(tmp, data, 0, seed, f"full_s{seed}") for seed in (0, 1)]
    warm, full = rows[1], rows[2:]
    result = {
        "what": "one negatives-study run (quick preset for a transformer: n = 2,048, m = 410 "
                "independent, 512 samples at batch 32) on all-MiniLM-L6-v2: bottom 4 layers "
                "frozen and cached (top 2 trained) against a full fine-tune",
        "data": {"pairs": pairs, "source": "crl.data.descriptions.write_description_pairs"},
        "machine_before": before, "machine_after": machine_state(), "runs": rows,
        "cache": cache,
        "ratio_full_over_frozen_warm_cpu": round(np.mean([r["run_cpu_s"] for r in full])
                                                 / warm["run_cpu_s"], 2),
        "recall@1": {"frozen": [rows[0]["recall@1"], warm["recall@1"]],
                     "full": [r["recall@1"] for r in full]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("cache", "ratio_full_over_frozen_warm_cpu",
                                             "recall@1")}))


if __name__ == "__main__":
    main()
