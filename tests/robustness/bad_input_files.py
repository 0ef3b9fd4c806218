"""Hostile and damaged files for the bad-input table (issue 27, rows 5-7 and 14): each builder
writes one file (or model directory, or run directory) under ``tmp`` and returns its path.

A payload that would run code creates ``tmp/pwned`` when it runs, so the table's check that no
file appeared also checks that nothing ran.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tiny_bert import write_tiny_bert

#: 24 good text pairs, one JSON object a line.
ROWS = [{"a": f"sort items {i}", "b": f"def sort {i}"} for i in range(24)]
GOOD_JSONL = "".join(json.dumps(r) + "\n" for r in ROWS)


class RunsShell:
    """Unpickling it calls ``os.system("touch <path>")``: a pickle that runs a shell command."""

    def __init__(self, path: Path) -> None:
        self.command = f"touch {path}"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (self.command,))


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def billion_laughs(levels: int) -> str:
    """A YAML config whose ``train.steps`` stands for ``9 ** (levels + 1)`` strings through
    nested aliases (8 levels: 1.3 kB of text, 387 million values)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]"
              for i in range(1, levels + 1)]
    return "\n".join([*lines, f"train: {{steps: *a{levels}}}", ""])


def laughs_yaml(tmp: Path, levels: int = 8) -> Path:
    """``bomb.yaml``: :func:`billion_laughs` as a config file."""
    return _write(tmp / "bomb.yaml", billion_laughs(levels).encode())


def deep_yaml(tmp: Path, depth: int = 5000) -> Path:
    """``deep.yaml``: a list nested ``depth`` levels (PyYAML's composer recurses per level)."""
    return _write(tmp / "deep.yaml", ("train: " + "[" * depth + "]" * depth + "\n").encode())


def nested_jsonl(tmp: Path, depth: int = 200_000) -> Path:
    """``pairs.jsonl`` whose line 25 is an array nested ``depth`` deep."""
    return _write(tmp / "pairs.jsonl", (GOOD_JSONL + "[" * depth + "]" * depth + "\n").encode())


def latin1_jsonl(tmp: Path, name: str = "pairs.jsonl") -> Path:
    """A ``.jsonl`` whose line 25 is Latin-1 (``caf\\xe9``), not UTF-8."""
    line = json.dumps({"a": "café", "b": "x"}, ensure_ascii=False)
    return _write(tmp / name, GOOD_JSONL.encode() + line.encode("latin-1") + b"\n")


def gzip_jsonl(tmp: Path) -> Path:
    """Good pairs, gzip-compressed, named ``pairs.jsonl``."""
    return _write(tmp / "pairs.jsonl", gzip.compress(GOOD_JSONL.encode()))


def good_jsonl(tmp: Path) -> Path:
    """24 good pairs in ``pairs.jsonl``."""
    return _write(tmp / "pairs.jsonl", GOOD_JSONL.encode())


def zero_width_npz(tmp: Path) -> Path:
    """``pairs.npz`` with ``a`` and ``b`` of shape (200, 0): pairs without values."""
    path = tmp / "pairs.npz"
    with path.open("wb") as handle:
        np.savez(handle, a=np.zeros((200, 0)), b=np.zeros((200, 0)))
    return path


def os_system_checkpoint(path: Path, marker: Path, protocol: int | None = None) -> None:
    """A checkpoint whose ``rng`` entry runs ``touch marker``: written by ``torch.save`` (zip
    format), or as a bare pickle of ``protocol``."""
    from crl.train.checkpoint import CHECKPOINT_KEYS

    state: dict[str, Any] = {key: 0 for key in CHECKPOINT_KEYS}
    state["rng"] = RunsShell(marker)
    if protocol is None:
        torch.save(state, path)
    else:
        path.write_bytes(pickle.dumps(state, protocol=protocol))


def pickled_pretrained(tmp: Path) -> Path:
    """A tiny BERT directory whose weights are a ``pytorch_model.bin`` pickle that runs
    ``touch tmp/pwned`` when trusted (its ``model.safetensors`` removed)."""
    model = write_tiny_bert(tmp / "bert")
    (model / "model.safetensors").unlink()
    torch.save({"embeddings.word_embeddings.weight": RunsShell(tmp / "pwned")},
               model / "pytorch_model.bin")
    return model


def truncated_safetensors(tmp: Path) -> Path:
    """A tiny BERT directory whose ``model.safetensors`` is cut to half."""
    model = write_tiny_bert(tmp / "bert")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return model


def text_run(tmp: Path) -> Path:
    """A finished run of a bag-of-tokens text model on :data:`ROWS` (for ``crl encode``)."""
    from crl.train import fit, load_config

    data = good_jsonl(tmp / "train-data")
    config = load_config("synthetic-gaussian", [
        "data.name=files", f"data.files.path={data}", "data.num_train=null",
        "model.kind=embedding_bag", "model.embed_dim=8", "model.token_dim=8",
        "model.max_tokens=8", "train.batch_size=8", "train.steps=2", "train.num_threads=1",
        "train.eval_every=null", "train.checkpoint_every=null", "eval.probe=false",
        "eval.ks=[1]"])
    run = tmp / "text-run"
    fit(config, run, progress=False)
    return run
