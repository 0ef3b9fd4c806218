"""IR metrics with qrels (crl.eval.ir): the hand-computed values of tests/data/beir_small, the
running top-k against a full sort at every block size, and parity with the peers on the same
embeddings: sentence-transformers' InformationRetrievalEvaluator (its own class, fed by a stub
model) and pytrec_eval (trec_eval's definitions) where it installs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from ir_peers import st_metrics, trec_metrics

from crl.data.beir import IRData, load_beir, read_qrels
from crl.errors import CrlValueError
from crl.eval.ir import Relevance, ir_metrics, ranking_metrics, top_k
from crl.eval.tasks import relevance_of
from crl.experiments.metrics import metric_keys, metric_spec, metric_value

BEIR_SMALL = Path(__file__).resolve().parents[1] / "data" / "beir_small"


def _judged(num_queries: int, num_docs: int, seed: int, graded: bool = False
            ) -> tuple[Relevance, dict[str, dict[str, int]]]:
    """Random judgements (1 to 5 documents per query; every fifth query judged all zero)."""
    g = torch.Generator().manual_seed(seed)
    query, doc, grade, qrels = [], [], [], {}
    for i in range(num_queries):
        docs = torch.randperm(num_docs, generator=g)[: 1 + i % 5].tolist()
        grades = [0 if i % 5 == 4 else (1 + j % 3 if graded else 1) for j in docs]
        qrels[f"q{i}"] = {f"d{j}": gr for j, gr in zip(docs, grades, strict=True)}
        query += [i] * len(docs)
        doc += docs
        grade += grades
    return (Relevance(torch.tensor(query), torch.tensor(doc),
                      torch.tensor(grade, dtype=torch.float64)), qrels)


def _ids(n: int, prefix: str) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def test_hand_computed_metrics_of_beir_small() -> None:
    data = load_beir(BEIR_SMALL)  # q3 is judged in dev only: left out
    assert data.query_ids == ["q1", "q2"] and len(data.doc_ids) == 6
    assert data.docs[1] == "Open a file and read every line of it."  # empty title dropped
    relevance, _ = relevance_of(data)
    # q1 ranks d3 (grade 1), d2, d1 (grade 2), ...; q2 ranks d1, d2 (grade 1), d3, ...
    ranked = torch.tensor([[2, 1, 0, 3, 4, 5], [0, 1, 2, 3, 4, 5]])
    m = ranking_metrics(ranked, relevance, num_docs=6, ks=(1, 3))
    log3 = math.log2(3)
    ndcg_q1 = (1 + 2 / 2) / (2 + 1 / log3)  # DCG 1/log2(2) + 2/log2(4); ideal 2, then 1
    assert m["ir/ndcg@3"] == pytest.approx((ndcg_q1 + 1 / log3) / 2, abs=1e-12)
    assert m["ir/ndcg@1"] == pytest.approx((1 / 2 + 0) / 2, abs=1e-12)
    assert m["ir/mrr@3"] == pytest.approx((1 + 1 / 2) / 2, abs=1e-12)
    assert m["ir/mrr@1"] == pytest.approx(0.5, abs=1e-12)
    assert m["ir/map@3"] == pytest.approx(((1 + 2 / 3) / 2 + (1 / 2) / 1) / 2, abs=1e-12)
    assert m["ir/recall@1"] == pytest.approx((1 / 2 + 0) / 2, abs=1e-12)
    assert m["ir/recall@3"] == pytest.approx((2 / 2 + 1 / 1) / 2, abs=1e-12)
    assert m["ir/precision@3"] == pytest.approx((2 / 3 + 1 / 3) / 2, abs=1e-12)
    assert m["ir/num_queries"] == 2


@pytest.mark.parametrize(("query_block", "corpus_block", "chunk"), [(4, 6, 7), (64, 50, 50),
                                                                     (1, 1, 3)])
def test_equal_to_sentence_transformers_evaluator_with_ties(query_block: int, corpus_block: int,
                                                            chunk: int) -> None:
    # small integer embeddings: exact scores with many ties, broken by the ids' string order
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-2, 3, (30, 4), generator=g).float()
    c = torch.randint(-2, 3, (50, 4), generator=g).float()
    relevance, graded = _judged(30, 50, seed=1)
    qrels = {qid: {d for d, gr in docs.items() if gr > 0} for qid, docs in graded.items()}
    qrels = {qid: docs for qid, docs in qrels.items() if docs}
    data = IRData(_ids(30, "q"), _ids(30, "q"), _ids(50, "d"), _ids(50, "d"), graded)
    _, rank = relevance_of(data)
    ks = [1, 3, 5, 10, 60]
    ours = ir_metrics(q, c, relevance, ks=ks, tie_rank=rank, query_block=query_block,
                      corpus_block=corpus_block)
    peer = st_metrics(q, c, qrels, ks, _ids(30, "q"), _ids(50, "d"), chunk=chunk)
    assert len(peer) == 25
    for key, value in peer.items():
        assert ours[key] == pytest.approx(value, abs=1e-12), key
    assert ours["ir/num_queries"] == len(qrels)


def test_equal_to_pytrec_eval_with_graded_judgements() -> None:
    pytest.importorskip("pytrec_eval")
    g = torch.Generator().manual_seed(2)
    q = torch.randn(20, 8, generator=g, dtype=torch.float64)
    c = torch.randn(40, 8, generator=g, dtype=torch.float64)
    relevance, qrels = _judged(20, 40, seed=3, graded=True)
    qrels = {qid: docs for qid, docs in qrels.items() if any(docs.values())}
    ks = [1, 3, 5, 10]
    ours = ir_metrics(q, c, relevance, ks=[*ks, 40], corpus_block=7)
    peer = trec_metrics(q, c, qrels, ks, _ids(20, "q"), _ids(40, "d"))
    assert ours["ir/mrr@40"] == pytest.approx(peer.pop("recip_rank"), abs=1e-12)
    for key, value in peer.items():
        # trec_eval's map_cut divides by R, ours (the peer evaluator's) by min(k, R): they agree
        # once k >= R (at most 5 judged documents here)
        if key.startswith("ir/map@") and int(key.split("@")[1]) < 5:
            continue
        assert ours[key] == pytest.approx(value, abs=1e-12), key


def test_top_k_is_the_full_sort_at_any_block_size() -> None:
    g = torch.Generator().manual_seed(4)
    q = torch.randint(-1, 2, (9, 3), generator=g).float()
    c = torch.randint(-1, 2, (23, 3), generator=g).float()
    rank = torch.randperm(23, generator=g)
    scores = q @ c.T
    expected = [sorted(range(23), key=lambda j, i=i: (-float(scores[i, j]), int(rank[j])))[:7]
                for i in range(9)]
    for query_block, corpus_block in [(1, 1), (2, 5), (9, 23), (100, 100), (4, 7)]:
        got = top_k(q, c, 7, tie_rank=rank, query_block=query_block, corpus_block=corpus_block)
        assert got.indices.tolist() == expected
        assert torch.equal(got.scores, scores.gather(1, got.indices))


def test_top_k_pads_a_corpus_smaller_than_k() -> None:
    got = top_k(torch.eye(2), torch.tensor([[0.0, 1.0]]), 3)
    assert got.indices.tolist() == [[0, -1, -1], [0, -1, -1]]
    m = ranking_metrics(got.indices, Relevance.pairs(1), num_docs=1, ks=(3,))
    # query 1 has no relevant document (left out); precision divides by k, as the peer's
    assert m["ir/precision@3"] == pytest.approx(1 / 3) and m["ir/recall@3"] == 1.0
    assert m["ir/num_queries"] == 1


def test_ir_study_metric_names() -> None:
    assert metric_spec("ndcg@10").higher_is_better and metric_keys("ndcg@10") == ("ir/ndcg@10",)
    assert metric_value({"ir/ndcg@10": 0.25}, "ndcg@10") == 0.25
    assert metric_keys("recall@1") != ("ir/recall@1",)  # still both directions' recall@1
    assert metric_spec("ir/recall@10").fraction


def test_evaluate_computes_the_ir_metrics_when_asked() -> None:
    from crl.models import DualEncoder
    from crl.train.config import EvalConfig
    from crl.train.evaluation import evaluate

    data = torch.randn(12, 4, generator=torch.Generator().manual_seed(5))
    from crl.data.base import TensorPairDataset

    split = TensorPairDataset(data, data + 0.1)
    model = DualEncoder(torch.nn.Identity(), torch.nn.Identity())
    plain = evaluate(model, split, EvalConfig(probe=False), temperature=0.1)
    with_ir = evaluate(model, split, EvalConfig(probe=False, ir=True), temperature=0.1)
    assert not any(k.startswith("ir/") for k in plain)
    assert {k: v for k, v in with_ir.items() if not k.startswith("ir/")} == plain
    za = torch.nn.functional.normalize(data, dim=1)
    zb = torch.nn.functional.normalize(data + 0.1, dim=1)
    assert with_ir["ir/ndcg@10"] == ir_metrics(za, zb, Relevance.pairs(12), ks=(1, 5, 10))[
        "ir/ndcg@10"]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: ir_metrics(torch.eye(2), torch.eye(2), Relevance.pairs(2), ks=(0,)), "ks"),
    (lambda: ir_metrics(torch.eye(2), torch.eye(3), Relevance.pairs(2)), "dimension"),
    (lambda: top_k(torch.eye(2), torch.tensor([[0.0, 1.0], [1.0, float("nan")], [0.0, 0.0]]), 1,
                   corpus_block=2), r"`corpus\[0:2\]` must be finite; got 1 NaN"),
    (lambda: ranking_metrics(torch.zeros(2, 1, dtype=torch.long), Relevance.pairs(3),
                             num_docs=3), r"relevance.query` must be in \[0, 2\)"),
    (lambda: ranking_metrics(torch.zeros(1, 1, dtype=torch.long),
                             Relevance(torch.tensor([0]), torch.tensor([0]),
                                       torch.tensor([0.0], dtype=torch.float64)), num_docs=1),
     "no query has a relevant document"),
])
def test_bad_input_is_named(call: object, message: str) -> None:
    with pytest.raises(CrlValueError, match=message):
        call()  # type: ignore[operator]


def test_bad_qrels_are_named(tmp_path: Path) -> None:
    with pytest.raises(CrlValueError, match="does not exist"):
        load_beir(BEIR_SMALL, split="train")
    bad = tmp_path / "bad.tsv"
    bad.write_text("query-id\tcorpus-id\tscore\nq1\td404\t1\n")
    with pytest.raises(CrlValueError, match=r"1 corpus id\(s\) that are not in the corpus"):
        load_beir(BEIR_SMALL, qrels=bad)
    bad.write_text("q1 Q0 d1 high\n")
    with pytest.raises(CrlValueError, match="line 1: the grade must be an integer"):
        read_qrels(bad)
    bad.write_text("q1 0 d1 1\nq1 0 d1 2\n")
    with pytest.raises(CrlValueError, match="judged twice"):
        read_qrels(bad)
    assert read_qrels(BEIR_SMALL / "qrels" / "test.tsv")["q1"] == {"d1": 2, "d3": 1}


def test_a_study_on_ndcg_turns_the_ir_metrics_on() -> None:
    from crl.experiments.negatives.study import NegativesStudy

    study = NegativesStudy("smoke", data="synthetic", metric="ndcg@10")
    assert all(spec.config["eval"]["ir"] for spec in study.runs())
    plain = NegativesStudy("smoke", data="synthetic")
    assert not any(spec.config["eval"].get("ir") for spec in plain.runs())
    rows = study._with_metric([{"ir/ndcg@10": 0.5, "n": 8, "m": 2, "negatives_per_step": 1}])
    assert rows[0]["ndcg@10"] == 0.5
