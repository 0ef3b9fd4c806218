"""Matryoshka end to end: ``crl train`` of a tiny BERT with ``loss.matryoshka`` reports the
retrieval metrics at each prefix, ``crl eval`` too, and ``crl export`` writes a
sentence-transformers model whose card lists the dimensions; loaded with ``truncate_dim`` it
gives the prefix of the run's embeddings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from crl.cli import app

pytest.importorskip("sentence_transformers", reason="needs sentence-transformers")
runner = CliRunner()
TEXTS = ["add two numbers", "sort items by key", "read a file", "open close file", "join strings",
         "count values", "return the sum", "write a file", "split strings", "first last value",
         "max of a list", "min of values", "print the value", "sort the list", "read lines",
         "join values"]


@pytest.mark.slow
def test_train_eval_export_at_prefixes(tiny_bert: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"q": t, "d": f"def {t}"}) + "\n" for t in TEXTS * 2))
    config = {
        "data": {"name": "files", "files": {"path": str(data), "columns": {"a": "q", "b": "d"}}},
        "model": {"kind": "transformer", "pretrained": str(tiny_bert), "max_seq_length": 16},
        "loss": {"name": "clip", "matryoshka": {"dims": [32, 8], "weights": [1.0, 0.5]}},
        "train": {"batch_size": 8, "steps": 2, "num_threads": 1},
        "optim": {"lr": 1e-3}, "eval": {"probe": False, "ks": [1]},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    result = runner.invoke(app, ["train", str(tmp_path / "run.yaml"), "--out",
                                 str(tmp_path / "runs"), "--no-progress"])
    assert result.exit_code == 0, result.output
    run = next((tmp_path / "runs").glob("*/summary.json")).parent
    summary = json.loads((run / "summary.json").read_text())
    assert 0 <= summary["retrieval_dim8/x2y_recall@1"] <= 1
    assert not any(key.startswith("retrieval_dim32/") for key in summary)
    result = runner.invoke(app, ["eval", str(run)])
    assert result.exit_code == 0 and "retrieval_dim8/x2y_recall@1" in result.output
    out = tmp_path / "exported"
    assert runner.invoke(app, ["export", str(run), str(out)]).exit_code == 0
    card = (out / "README.md").read_text()
    assert "## Matryoshka dimensions" in card and "dimensions 32, 8" in card
    assert "truncate_dim=8" in card and "- matryoshka" in card
    full = SentenceTransformer(str(out), device="cpu").encode(TEXTS)
    cut = SentenceTransformer(str(out), device="cpu", truncate_dim=8).encode(TEXTS)
    np.testing.assert_allclose(cut, full[:, :8], atol=1e-6, rtol=0)
