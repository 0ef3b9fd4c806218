"""Blockwise IR evaluation at a million documents: time and peak memory of crl's running top-k
(:func:`crl.eval.ir.ir_metrics`) against sentence-transformers' InformationRetrievalEvaluator on
the same embeddings, each in its own fresh process (docs/evaluation.md, "Benchmark").

A synthetic corpus of ``N`` unit-norm float32 vectors of dimension 384 (1,000,000 x 384 is
1.5 GB) and ``Q`` queries, each relevant to 1 to 3 random documents (grade 1), scored by inner
product; metrics at k = 1, 10, 100. Both sides get the embeddings already computed (the
evaluator through ``corpus_embeddings`` and a stub model for the queries), so the measurement
is the scoring, the top-k and the metrics. Peak memory is the process's ``VmHWM`` minus its
resident memory once the inputs exist.

    python benchmarks/ir_eval.py                       # N = 1,000,000, Q = 1,000
    python benchmarks/ir_eval.py --docs 20000 --out /tmp/ir.json   # seconds: a check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "ir_eval.json"
DIM = 384
KS = [1, 10, 100]


def _rss_gib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _inputs(num_docs: int, num_queries: int, seed: int) -> tuple[Any, Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    corpus = torch.empty(num_docs, DIM)
    for start in range(0, num_docs, 100_000):  # in slices: no second full-size temporary
        block = torch.randn(min(100_000, num_docs - start), DIM, generator=g)
        corpus[start:start + len(block)] = torch.nn.functional.normalize(block, dim=1)
    # queries near a relevant document (cosine about 0.28 with it, against about 0.22 for the
    # best of a million random ones): some found first, some lower, some missed
    relevant = [torch.randint(0, num_docs, (1 + i % 3,), generator=g).unique()
                for i in range(num_queries)]
    anchors = torch.stack([corpus[r[0]] for r in relevant])
    queries = torch.nn.functional.normalize(
        anchors + 3.5 * torch.randn(num_queries, DIM, generator=g) / DIM**0.5, dim=1)
    return queries, corpus, relevant


def _ids(n: int, prefix: str) -> list[str]:
    width = len(str(n))
    return [f"{prefix}{i:0{width}d}" for i in range(n)]  # string order = row order


def worker(side: str, num_docs: int, num_queries: int, seed: int) -> dict[str, Any]:
    """One measurement in this process: ``crl`` or ``sentence-transformers``."""
    import torch

    if side != "crl":
        from sentence_transformers.sentence_transformer.evaluation import (
            InformationRetrievalEvaluator,
        )
    from crl.eval.ir import Relevance, ir_metrics

    queries, corpus, relevant = _inputs(num_docs, num_queries, seed)
    base = _rss_gib("VmRSS")
    start = time.perf_counter()
    cpu = time.process_time()
    if side == "crl":
        rel = Relevance(torch.cat([torch.full((len(r),), i) for i, r in enumerate(relevant)]),
                        torch.cat(relevant), torch.ones(sum(len(r) for r in relevant),
                                                        dtype=torch.float64))
        metrics = ir_metrics(queries, corpus, rel, ks=KS)
        metrics = {k: v for k, v in metrics.items() if k != "ir/num_queries"}
    else:
        qids, dids = _ids(num_queries, "q"), _ids(num_docs, "d")

        class Stub:
            def encode_query(self, texts: list[str], **_: Any) -> Any:
                return queries[[int(t[1:]) for t in texts]]

        evaluator = InformationRetrievalEvaluator(
            {q: q for q in qids}, {d: d for d in dids},
            {qids[i]: {dids[j] for j in r.tolist()} for i, r in enumerate(relevant)},
            mrr_at_k=KS, ndcg_at_k=KS, accuracy_at_k=KS, precision_recall_at_k=KS,
            map_at_k=KS, show_progress_bar=False, write_csv=False,
            score_functions={"dot": lambda a, b: a @ b.T})
        scores = evaluator.compute_all_metrics(Stub(), corpus_embeddings=corpus)["dot"]
        metrics = {f"ir/{name.split('@')[0]}@{k}": float(v) for name, by_k in scores.items()
                   if name != "accuracy@k" for k, v in by_k.items()}
    seconds = time.perf_counter() - start
    return {"side": side, "seconds": round(seconds, 2),
            "cpu_seconds": round(time.process_time() - cpu, 2),
            "inputs_gib": round((corpus.numel() + queries.numel()) * 4 / 2**30, 3),
            "resident_before_gib": round(base, 3),
            "peak_above_inputs_gib": round(_rss_gib("VmHWM") - base, 3),
            "threads": torch.get_num_threads(), "metrics": metrics}


def _run(side: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", side, "--docs", str(args.docs),
               "--queries", str(args.queries), "--seed", str(args.seed)]
    load = os.getloadavg()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    row: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    row["load_before"], row["load_after"] = [round(x, 2) for x in load], [
        round(x, 2) for x in os.getloadavg()]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", choices=["crl", "sentence-transformers"])
    parser.add_argument("--skip-peer", action="store_true", help="measure crl only")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.docs, args.queries, args.seed)))
        return
    import torch

    rows = [_run("crl", args)]
    if not args.skip_peer:
        rows.append(_run("sentence-transformers", args))
    result: dict[str, Any] = {
        "benchmark": "blockwise IR evaluation (crl.eval.ir.ir_metrics)",
        "docs": args.docs, "queries": args.queries, "dim": DIM, "ks": KS,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                     text=True, check=False).stdout.strip(),
        "rows": rows,
    }
    if len(rows) == 2:
        crl, peer = rows
        result["time_ratio_crl_vs_peer"] = round(crl["seconds"] / peer["seconds"], 3)
        result["memory_ratio_crl_vs_peer"] = round(
            crl["peak_above_inputs_gib"] / max(peer["peak_above_inputs_gib"], 1e-9), 3)
        result["max_metric_difference"] = max(abs(crl["metrics"][k] - v)
                                              for k, v in peer["metrics"].items())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
    for row in rows:
        print(row["side"], row["seconds"], "s", row["peak_above_inputs_gib"], "GiB above inputs")


if __name__ == "__main__":
    main()
