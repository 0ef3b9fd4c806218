"""``crl eval`` without training first: the bundled MiniLM (zero-shot) on a BEIR directory and on
mined docstring-code pairs with several relevant functions per docstring (equal to
sentence-transformers' own model and evaluator), a run scored on a file, the split fixed by a
test file or a split column and recorded in the run directory, and bad input in one line."""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ir_peers import flat
from typer.testing import CliRunner

from crl.cli import app
from crl.data.pycode import extract_pairs
from crl.train import fit, load_config

runner = CliRunner()
BEIR_SMALL = Path(__file__).resolve().parents[1] / "data" / "beir_small"


def _crl(*args: str) -> Any:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def _rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _metrics(path: Path) -> dict[str, float]:
    return dict(json.loads(path.read_text())["metrics"])


@pytest.fixture(scope="module")
def asyncio_pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """32 docstring-code pairs of the standard library's asyncio (not deduplicated): every
    docstring that documents several functions there (9 docstrings, 19 functions in Python
    3.11), and the first others."""
    root = Path(sysconfig.get_paths()["stdlib"]) / "asyncio"
    pairs = [p for f in sorted(root.glob("*.py"))
             for p in extract_pairs(f.read_text(encoding="utf-8"), f.name, max_code_chars=200)]
    counts: dict[str, int] = {}
    for p in pairs:
        counts[p.doc] = counts.get(p.doc, 0) + 1
    shared = [p for p in pairs if counts[p.doc] > 1]
    if len(shared) < 6:
        pytest.skip("this Python's asyncio has too few shared docstrings")
    single = [p for p in pairs if counts[p.doc] == 1][: 32 - len(shared)]
    rows = [{"doc": p.doc, "code": p.code} for p in shared + single]
    return _rows(tmp_path_factory.mktemp("asyncio") / "pairs.jsonl", rows)


def _peer(queries: dict[str, str], corpus: dict[str, str], relevant: dict[str, set[str]],
          ks: list[int]) -> dict[str, float]:
    """sentence-transformers' own MiniLM and InformationRetrievalEvaluator."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import (
        InformationRetrievalEvaluator,
    )
    from sentence_transformers.util import cos_sim

    from crl.models.text import minilm_model_dir

    model = SentenceTransformer(str(minilm_model_dir()), device="cpu")
    evaluator = InformationRetrievalEvaluator(
        queries, corpus, relevant, mrr_at_k=ks, ndcg_at_k=ks, accuracy_at_k=ks,
        precision_recall_at_k=ks, map_at_k=ks, show_progress_bar=False, write_csv=False,
        score_functions={"cosine": cos_sim})
    return flat(evaluator.compute_all_metrics(model)["cosine"])


def test_minilm_zero_shot_on_mined_pairs_equals_sentence_transformers(
        asyncio_pairs: Path, tmp_path: Path) -> None:
    out = tmp_path / "minilm.json"
    _crl("eval", "--model", "minilm", "--data", str(asyncio_pairs), "--a-column", "doc",
         "--b-column", "code", "--ks", "1,3,10", "--out", str(out))
    ours = _metrics(out)
    rows = [json.loads(line) for line in asyncio_pairs.read_text().splitlines()]
    queries = {doc: doc for doc in dict.fromkeys(r["doc"] for r in rows)}
    corpus = {code: code for code in dict.fromkeys(r["code"] for r in rows)}
    relevant: dict[str, set[str]] = {}
    for r in rows:
        relevant.setdefault(r["doc"], set()).add(r["code"])
    assert ours["ir/num_queries"] == len(queries) < len(rows)  # several relevant for some
    peer = _peer(queries, corpus, relevant, [1, 3, 10])
    for key, value in peer.items():
        assert ours[key] == pytest.approx(value, abs=1e-6), key
    assert 0 < ours["retrieval/x2y_recall@1"] <= 1 and ours["num_pairs"] == len(rows)


def test_minilm_on_a_beir_directory(tiny_bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "beir.json"
    _crl("eval", "--model", "minilm", "--beir", str(BEIR_SMALL), "--ks", "1,10", "--out",
         str(out))
    record = json.loads(out.read_text())
    assert record["model"] == "minilm" and record["split"] == "test"
    assert record["metrics"]["ir/num_queries"] == 2 and record["metrics"]["ir/num_docs"] == 6
    dev = tmp_path / "dev.json"
    _crl("eval", "--model", str(tiny_bert), "--beir", str(BEIR_SMALL), "--split", "dev",
         "--out", str(dev))
    assert _metrics(dev)["ir/num_queries"] == 1


def _fit(tmp: Path, *extra: str) -> Path:
    config = load_config("synthetic-gaussian", [
        "data.name=files", "data.num_train=null", "model.kind=embedding_bag",
        "model.embed_dim=8", "model.token_dim=8", "model.max_tokens=8", "train.batch_size=4",
        "train.steps=2", "train.num_threads=1", "eval.probe=false", "eval.ks=[1,5]", *extra])
    return fit(config, tmp / "run", progress=False).run_dir


ROWS = [{"q": f"sort the items {i}", "d": f"def sort_{i}(x): return sorted(x)"}
        for i in range(24)]


def test_a_test_file_is_the_test_split_and_is_recorded(tmp_path: Path) -> None:
    train = _rows(tmp_path / "train.jsonl", ROWS[:16])
    test = _rows(tmp_path / "test.jsonl", ROWS[16:])
    run = _fit(tmp_path, f"data.files.path={train}", f"data.files.test_path={test}",
               "data.files.columns.a=q", "data.files.columns.b=d", "data.val_fraction=0.25")
    split = json.loads((run / "config.json").read_text())["data"]["split"]
    assert split["how"] == "files" and split["test"]["file"] == str(test.resolve())
    assert split["num_train"] == 12 and len(split["val"]) == 4
    _crl("eval", str(run))  # the run's own test split: the test file
    own = json.loads((run / "eval.json").read_text())["metrics"]
    out = tmp_path / "on-file.json"
    _crl("eval", "--model", str(run), "--data", str(test), "--out", str(out))
    on_file = _metrics(out)
    for key in ("retrieval/x2y_recall@1", "retrieval/y2x_recall@5", "retrieval/x2y_auc"):
        assert on_file[key] == own[key]
    assert on_file["num_pairs"] == 8 and "ir/ndcg@5" in on_file


def test_a_split_column_fixes_the_split(tmp_path: Path) -> None:
    names = ["train"] * 14 + ["val"] * 4 + ["test"] * 6
    data = _rows(tmp_path / "pairs.jsonl", [{**r, "part": s} for r, s in zip(ROWS, names,
                                                                              strict=True)])
    run = _fit(tmp_path, f"data.files.path={data}", "data.files.split_column=part",
               "data.files.columns.a=q", "data.files.columns.b=d")
    split = json.loads((run / "config.json").read_text())["data"]["split"]
    assert split["test"] == list(range(18, 24)) and split["val"] == list(range(14, 18))
    _crl("eval", str(run))
    own = json.loads((run / "eval.json").read_text())["metrics"]
    out = tmp_path / "test-rows.json"
    _crl("eval", "--model", str(run), "--data", str(data), "--split", "test",
         "--split-column", "part", "--out", str(out))
    assert _metrics(out)["retrieval/x2y_recall@1"] == own["retrieval/x2y_recall@1"]
    assert _metrics(out)["num_pairs"] == 6


def test_a_model_directory_and_a_relevant_ids_column(tiny_bert: Path, tmp_path: Path) -> None:
    rows = [{"id": f"f{i}", "q": r["q"], "d": r["d"], "rel": f"f{(i + 1) % 6}"}
            for i, r in enumerate(ROWS[:6])]
    data = _rows(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "bert.json"
    result = _crl("eval", "--model", str(tiny_bert), "--data", str(data), "--a-column", "q",
                  "--b-column", "d", "--id-column", "id",
                  "--relevant-column", "rel", "--ks", "1,2", "--out", str(out))
    assert "wrote" in result.output
    record = json.loads(out.read_text())
    assert record["model_kind"] == "pretrained"
    assert record["metrics"]["ir/recall@2"] <= 1 and record["metrics"]["ir/num_queries"] == 6


def _args(tmp: Path) -> dict[str, Callable[[], list[str]]]:
    return {
        "eval: --model minilm has no split of its own": lambda: ["eval", "--model", "minilm"],
        "eval: --qrels needs --beir DIR": lambda: ["eval", "--model", "minilm", "--qrels",
                                                   str(tmp / "x.tsv")],
        "eval: --ks must be comma-separated integers >= 1": lambda: [
            "eval", "--model", "minilm", "--beir", str(BEIR_SMALL), "--ks", "0,10"],
        "qrels: ": lambda: ["eval", "--model", "minilm", "--beir", str(BEIR_SMALL), "--qrels",
                            str(tmp / "missing.tsv")],
        "eval: --split test needs --split-column": lambda: [
            "eval", "--model", "minilm", "--data", str(_rows(tmp / "p.jsonl", [
                {"a": "x y", "b": "z w"}] * 3)), "--split", "test"],
        "not both": lambda: ["eval", str(tmp), "--model", "minilm"],
    }


@pytest.mark.parametrize("message", list(_args(Path("."))))
def test_bad_input_is_one_line(message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, _args(tmp_path)[message]())
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
