"""``crl mine`` end to end: every output format is read back by ``crl train``'s column map with
the mined negatives, the rows and other columns are kept, and a run trains on the mined file
with the guide (``loss.guide``) of the same model, plain and with gradient caching."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import make_pairs
from crl.cli import app
from crl.data import ColumnsConfig
from crl.data.files import load_pair_file

runner = CliRunner()


def write_pairs(path: Path) -> Path:
    anchors, positives = make_pairs(30)
    rows = [{"query": a, "doc": b, "topic": i % 3} for i, (a, b) in
            enumerate(zip(anchors, positives, strict=True))]
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("out_name", ["mined.jsonl", "mined.csv", "mined.parquet"])
def test_mined_file_reads_back(st_model_dir: Path, tmp_path: Path, out_name: str) -> None:
    data = write_pairs(tmp_path / ("pairs.parquet" if out_name.endswith("parquet")
                                   else "pairs.jsonl"))
    out = tmp_path / out_name
    result = runner.invoke(app, ["mine", str(data), "--model", str(st_model_dir), "--out",
                                 str(out), "--a", "query", "--b", "doc", "--num-negatives", "2",
                                 "--backend", "torch"])
    assert result.exit_code == 0, result.output
    assert "negative_1, negative_2" in result.output
    columns = ColumnsConfig(a="query", b="doc", label="topic",
                            negatives=["negative_1", "negative_2"])
    ds, _ = load_pair_file(out, columns)
    original, _ = load_pair_file(data, ColumnsConfig(a="query", b="doc", label="topic"))
    assert len(ds) == len(original) and ds.num_hard_negatives == 2
    assert ds.a == original.a and ds.labels.tolist() == original.labels.tolist()
    for i in range(len(ds)):
        assert ds.b[i] not in ds.negatives[i] and len(set(ds.negatives[i])) == 2


def test_train_on_mined_negatives_with_the_guide(st_model_dir: Path, tmp_path: Path) -> None:
    data = write_pairs(tmp_path / "pairs.jsonl")
    out = tmp_path / "mined.jsonl"
    assert runner.invoke(app, ["mine", str(data), "--model", str(st_model_dir), "--out",
                               str(out), "--a", "query", "--b", "doc"]).exit_code == 0
    losses = []
    for micro in (None, 4):
        config = {
            "data": {"name": "files", "files": {"path": str(out), "columns": {
                "a": "query", "b": "doc", "negatives": ["negative_1", "negative_2",
                                                        "negative_3"]}}},
            "model": {"kind": "embedding_bag", "token_dim": 8, "embed_dim": 8,
                      "max_tokens": 8},
            "loss": {"name": "info_nce", "guide": {"model": str(st_model_dir),
                                                   "margin": 0.01}},
            "train": {"batch_size": 8, "steps": 2, "num_threads": 1,
                      "micro_batch_size": micro},
            "eval": {"probe": False, "ks": [1]}}
        file = tmp_path / f"run{micro}.yaml"
        file.write_text(yaml.safe_dump(config))
        result = runner.invoke(app, ["train", str(file), "--out", str(tmp_path / f"r{micro}"),
                                     "--no-progress"])
        assert result.exit_code == 0, result.output
        history = next((tmp_path / f"r{micro}").rglob("metrics.jsonl")).read_text()
        records = [json.loads(line) for line in history.splitlines()]
        losses.append([r["train/loss"] for r in records if "train/loss" in r])
    assert losses[0] and losses[0] == pytest.approx(losses[1], rel=1e-5)
