"""A user's tables of texts through ``crl train``: every format, the column map, hard negatives,
and each error as one line with exit code 2 (docs/data.md, "Your own files")."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from crl.cli import app
from crl.data import ColumnsConfig, DataConfig, load_data
from crl.data.files import load_pair_file

runner = CliRunner()
N = 24
ROWS = [{"query": f"sort items {i}", "doc": f"def sort {i}", "neg": f"def read {i}",
         "cls": i % 3} for i in range(N)]
COLUMNS = {"a": "query", "b": "doc", "label": "cls", "negatives": ["neg"]}
# A run of seconds: a small bag of tokens, two steps, no probes.
TINY = {"model": {"kind": "embedding_bag", "token_dim": 8, "embed_dim": 8, "max_tokens": 8},
        "train": {"batch_size": 8, "steps": 2, "num_threads": 1},
        "eval": {"probe": False, "ks": [1], "hard_negatives": True}}


def put(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_csv(path: Path, rows: list[dict[str, Any]], delimiter: str = ",") -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_saved_dataset(path: Path, rows: list[dict[str, Any]]) -> Path:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


WRITERS = {
    "jsonl": lambda d, rows: write_jsonl(d / "pairs.jsonl", rows),
    "csv": lambda d, rows: write_csv(d / "pairs.csv", rows),
    "tsv": lambda d, rows: write_csv(d / "pairs.tsv", rows, "\t"),
    "parquet": lambda d, rows: write_parquet(d / "pairs.parquet", rows),
    "save_to_disk": lambda d, rows: write_saved_dataset(d / "pairs_ds", rows),
}


def train(tmp: Path, path: Path | str, columns: dict[str, Any] | None = None,
          **sections: Any) -> Any:
    """``crl train CONFIG`` on the file ``path``; the CliRunner result."""
    config: dict[str, Any] = {k: dict(v) for k, v in TINY.items()}
    config["data"] = {"name": "files", "files": {"path": str(path), "columns": columns or {}}}
    for key, value in sections.items():
        config[key] = value
    file = tmp / "run.yaml"
    file.write_text(yaml.safe_dump(config))
    return runner.invoke(app, ["train", str(file), "--out", str(tmp / "runs"), "--no-progress"])


def one_error_line(result: Any) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_every_format_trains_through_the_column_map(fmt: str, tmp_path: Path) -> None:
    path = WRITERS[fmt](tmp_path, ROWS)
    ds, provenance = load_pair_file(path, ColumnsConfig(**COLUMNS))
    assert ds.is_text and len(ds) == N and ds[5][:4] == ("sort items 5", "def sort 5", 5, 2)
    assert ds[5][4] == ["def read 5"] and ds.num_hard_negatives == 1
    assert len(provenance["sha256"]) == 64
    result = train(tmp_path, path, COLUMNS)
    assert result.exit_code == 0, result.output
    summary = json.loads(next((tmp_path / "runs").glob("*/summary.json")).read_text())
    assert summary["step"] == 2 and 0 <= summary["retrieval/x2y_recall@1"] <= 1


def test_default_columns_and_label(tmp_path: Path) -> None:
    rows = [{"a": r["query"], "b": r["doc"], "label": r["cls"]} for r in ROWS]
    splits = load_data(DataConfig(name="files", files={"path": str(write_csv(
        tmp_path / "p.csv", rows))}))
    assert splits.info.kind == "text" and splits.info.num_classes == 3
    assert splits.train.num_hard_negatives == 0 and len(splits.train[0]) == 4


def test_a_text_file_without_model_section_gets_the_text_default(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    result = train(tmp_path, path, COLUMNS, model={})
    assert result.exit_code == 0, result.output
    config = json.loads(next((tmp_path / "runs").glob("*/config.json")).read_text())
    assert config["config"]["model"]["kind"] == "auto"


def test_an_mlp_for_text_is_refused_naming_kinds_that_can(tmp_path: Path) -> None:
    line = one_error_line(train(tmp_path, write_jsonl(tmp_path / "p.jsonl", ROWS), COLUMNS,
                                model={"kind": "mlp"}))
    assert "'mlp' does not take text data" in line and "'transformer'" in line


@pytest.mark.parametrize(("make", "expected"), [
    (lambda d: d, r"is a directory, not a file; a directory must be written by datasets' "
                  r"save_to_disk"),
    (lambda d: d / "absent.csv", r"no such file .*absent\.csv"),
    (lambda d: put(d / "e.csv", ""), r"e\.csv is empty"),
    (lambda d: put(d / "h.csv", "query,doc,cls,neg\n"), r"h\.csv holds no pairs"),
    (lambda d: put(d / "x.xlsx", "q"), r"unsupported file type '\.xlsx'"),
    (lambda d: write_jsonl(d / "p.jsonl", [*ROWS[:3], {**ROWS[3], "query": 7}]),
     r"p\.jsonl, line 4, column 'query': expected text, found int 7"),
    (lambda d: write_parquet(d / "p.parquet", [*ROWS[:2], {**ROWS[2], "doc": "  "}, *ROWS[3:]]),
     r"p\.parquet, row 2, column 'doc': empty text '  '"),
    (lambda d: write_csv(d / "p.csv", [*ROWS[:5], {**ROWS[5], "neg": ""}]),
     r"p\.csv, line 7, column 'neg': empty text ''"),
    (lambda d: write_csv(d / "p.csv", [*ROWS[:1], {**ROWS[1], "cls": "cat"}]),
     r"p\.csv, line 3, column 'cls': expected an integer class id, found 'cat'"),
    (lambda d: write_jsonl(d / "p.jsonl", [{k: v for k, v in r.items() if k != "doc"}
                                           for r in ROWS]),
     r"has no column 'doc' \(set data.files.columns.b\); its columns are "
     r"\['query', 'neg', 'cls'\]"),
    (lambda d: put(d / "p.jsonl", '{"query": "x"}\n[1]\n'), r"line 2 must be a JSON object"),
    (lambda d: put(d / "p.jsonl", '{"query": "x"}\n{"query": \n'),
     r"p\.jsonl, line 2 is not valid JSON"),
    (lambda d: put(d / "p.csv", "query,doc\nx,y,z\n"),
     r"p\.csv, line 2 has 3 field\(s\) but the header has 2"),
])
def test_file_errors_are_one_line(make: Any, expected: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("x")
    line = one_error_line(train(tmp_path, make(data), COLUMNS))
    assert re.search(expected, line), line


def test_a_dataset_dict_directory_names_its_splits(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(ROWS)
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    line = one_error_line(train(tmp_path, tmp_path / "dd", COLUMNS))
    assert "holds a DatasetDict with splits ['test', 'train']; give one split's directory" in line


def test_column_map_validation_is_one_line(tmp_path: Path) -> None:
    line = one_error_line(train(tmp_path, write_jsonl(tmp_path / "p.jsonl", ROWS),
                                {"a": "query", "b": "query"}))
    assert "data.files.columns" in line and "'query'" in line


def test_the_examples_of_docs_data_md_read_the_same_pairs(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text()
    section = doc[doc.index("### Your own files"):doc.index("## Encoders")]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)
    jsonl = next(body for lang, body in blocks if body.startswith('{"query"'))
    csv_text = next(body for lang, body in blocks if body.startswith("query,doc"))
    config = yaml.safe_load(next(body for lang, body in blocks if lang == "yaml"))
    columns = ColumnsConfig(**config["data"]["files"]["columns"])
    rows = [json.loads(line) for line in jsonl.splitlines()]
    paths = [put(tmp_path / "pairs.jsonl", jsonl), put(tmp_path / "pairs.csv", csv_text),
             write_parquet(tmp_path / "pairs.parquet", rows),
             write_saved_dataset(tmp_path / "pairs_ds", rows)]
    items = [[ds[i] for i in range(len(ds))]
             for ds in (load_pair_file(p, columns)[0] for p in paths)]
    assert len(items[0]) == 3 and all(other == items[0] for other in items[1:])
    assert items[0][2] == ("read a file", "def read(p): return open(p).read()", 2, 2,
                           ["def write(p, s): open(p, 'w').write(s)"])


def test_a_list_column_of_negatives_and_uneven_rows(tmp_path: Path) -> None:
    rows = [{"query": r["query"], "doc": r["doc"], "negs": [r["neg"], "print value"]}
            for r in ROWS]
    columns = {"a": "query", "b": "doc", "negatives": ["negs"]}
    for path in (write_parquet(tmp_path / "p.parquet", rows),
                 write_saved_dataset(tmp_path / "ds", rows)):
        ds, _ = load_pair_file(path, ColumnsConfig(**columns))
        assert ds.num_hard_negatives == 2 and ds[3][4] == ["def read 3", "print value"]
    rows[4]["negs"] = ["only one"]
    line = one_error_line(train(tmp_path, write_jsonl(tmp_path / "p.jsonl", rows), columns))
    assert ("line 5: 1 hard negative(s) in columns ['negs'], where line 1 has 2; every row "
            "needs the same number") in line
    again = tmp_path / "again"
    again.mkdir()
    result = train(again, write_jsonl(again / "p.jsonl", rows[:4] + rows[5:]), columns)
    assert result.exit_code == 0, result.output


def test_eval_hard_negatives_without_negative_columns_is_refused(tmp_path: Path) -> None:
    line = one_error_line(train(tmp_path, write_jsonl(tmp_path / "p.jsonl", ROWS),
                                {"a": "query", "b": "doc"}))
    assert "eval.hard_negatives needs hard negatives in the data" in line
