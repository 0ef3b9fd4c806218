"""The peers' IR metrics on given embeddings: sentence-transformers' InformationRetrievalEvaluator
fed by a stub model, and pytrec_eval (when installed)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class StubModel:
    """What the evaluator asks of a model: encode_query / encode_document of texts, which here
    are ids looked up in fixed embeddings."""

    def __init__(self, queries: dict[str, Tensor], corpus: dict[str, Tensor]) -> None:
        self.queries, self.corpus = queries, corpus

    def encode_query(self, texts: list[str], **_: Any) -> Tensor:
        return torch.stack([self.queries[t] for t in texts])

    def encode_document(self, texts: list[str], **_: Any) -> Tensor:
        return torch.stack([self.corpus[t] for t in texts])


def st_metrics(q: Tensor, c: Tensor, qrels: dict[str, set[str]], ks: list[int],
               query_ids: list[str], doc_ids: list[str], chunk: int = 7) -> dict[str, float]:
    """``ir/<metric>@k`` of sentence-transformers' evaluator on embeddings ``q``, ``c`` scored
    by inner product."""
    from sentence_transformers.sentence_transformer.evaluation import (
        InformationRetrievalEvaluator,
    )

    evaluator = InformationRetrievalEvaluator(
        queries={i: i for i in query_ids}, corpus={i: i for i in doc_ids},
        relevant_docs=qrels, corpus_chunk_size=chunk, mrr_at_k=ks, ndcg_at_k=ks,
        accuracy_at_k=ks, precision_recall_at_k=ks, map_at_k=ks, show_progress_bar=False,
        score_functions={"dot": lambda a, b: a @ b.T}, write_csv=False)
    model = StubModel(dict(zip(query_ids, q, strict=True)), dict(zip(doc_ids, c, strict=True)))
    return flat(evaluator.compute_all_metrics(model)["dot"])


def flat(scores: dict[str, dict[int, float]]) -> dict[str, float]:
    """The evaluator's ``{"ndcg@k": {10: v}, ...}`` as crl's ``{"ir/ndcg@10": v, ...}`` (its
    accuracy@k, which crl does not report, left out)."""
    return {f"ir/{name.split('@')[0]}@{k}": float(v) for name, by_k in scores.items()
            if name != "accuracy@k" for k, v in by_k.items()}


def trec_metrics(q: Tensor, c: Tensor, qrels: dict[str, dict[str, int]], ks: list[int],
                 query_ids: list[str], doc_ids: list[str]) -> dict[str, float]:
    """pytrec_eval's ``ndcg_cut``, ``recall``, ``P``, ``recip_rank`` (uncut) and ``map_cut`` on
    the full ranking of every query (inner-product scores), averaged over the judged queries."""
    import pytrec_eval

    scores = (q.double() @ c.double().T).tolist()
    run = {qid: dict(zip(doc_ids, row, strict=True))
           for qid, row in zip(query_ids, scores, strict=True) if qid in qrels}
    cuts = ",".join(map(str, ks))
    measures = {f"ndcg_cut.{cuts}", f"recall.{cuts}", f"P.{cuts}", f"map_cut.{cuts}",
                "recip_rank"}
    per_query = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    names = {"ndcg_cut": "ndcg", "recall": "recall", "P": "precision", "map_cut": "map"}
    out: dict[str, float] = {}
    for measure, name in names.items():
        for k in ks:
            values = [m[f"{measure}_{k}"] for m in per_query.values()]
            out[f"ir/{name}@{k}"] = sum(values) / len(values)
    out["recip_rank"] = sum(m["recip_rank"] for m in per_query.values()) / len(per_query)
    return out
