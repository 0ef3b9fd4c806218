"""``crl bench retrieval``: every metric of ``retrieval_metrics`` against a faiss top-k search.

``N`` queries against ``N`` candidates (``D = 128``, float32, unit-norm, ``b[i]`` the positive of
``a[i]``). crl computes all of :func:`~crl.eval.retrieval_metrics` (recall@1/5/10, AUC criterion,
mean and median rank, both directions) blockwise; the baseline is faiss-cpu's exact
``IndexFlatIP`` (``add`` + ``search`` with ``k = 10``, one direction), which gives recall@k only.
Each runs in its own fresh process; time, peak resident memory above the interpreter's baseline,
their ratios, and the recall@k of both (they must agree) are reported. Needs the ``bench`` extra
(``pip install crl[bench]``) for faiss.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
from collections.abc import Callable
from typing import Any

from crl.bench._measure import GIB, machine_state, run_tasks
from crl.env import environment_info, package_version
from crl.errors import CrlValueError

#: The full benchmark's size.
N_FULL = 100_000
DIM = 128
K = 10


def run_retrieval_benchmark(
    *,
    n: int = N_FULL,
    dim: int = DIM,
    k: int = K,
    block_size: int = 1024,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure crl's blockwise retrieval metrics and a faiss flat search side by side.

    Args:
        n: Number of queries and of candidates.
        dim: Embedding dimension.
        k: faiss's ``k`` (and crl's largest recall cut-off).
        block_size: ``block_size`` passed to ``retrieval_metrics``.
        quick: A seconds-long run for tests (``n = 2000``, ``dim = 16``, both in one process,
            no targets).
        progress: Called with the name of each measurement before it starts.

    Returns:
        A JSON-ready dict with ``config``, machine state, ``crl`` and ``faiss`` results, the
        ratios and, for a full run, ``targets``.

    Raises:
        CrlValueError: when faiss is not installed.
    """
    if importlib.util.find_spec("faiss") is None:
        raise CrlValueError(
            "crl bench retrieval: the baseline needs faiss-cpu; install it with "
            "`pip install crl[bench]` (or `pip install faiss-cpu`)"
        )
    if quick:
        n, dim = min(n, 2000), min(dim, 16)
    before = machine_state()
    base = {"kind": "retrieval", "n": n, "dim": dim, "k": k, "repeats": 1, "warmup": 0}
    tasks = [{**base, "name": f"crl retrieval_metrics N={n}", "impl": "crl",
              "block_size": block_size},
             {**base, "name": f"faiss IndexFlatIP N={n}", "impl": "faiss"}]
    crl_res, faiss_res = run_tasks(tasks, separate=not quick, progress=progress)

    def summary(res: dict[str, Any]) -> dict[str, Any]:
        return {"seconds": round(res["seconds"], 4),
                "peak_above_baseline_gib": round((res["peak_rss"] - res["baseline_rss"]) / GIB,
                                                 4),
                "baseline_rss_gib": round(res["baseline_rss"] / GIB, 4),
                "metrics": res["metrics"]}

    crl_sum, faiss_sum = summary(crl_res), summary(faiss_res)
    ratio = crl_sum["seconds"] / faiss_sum["seconds"]
    agree = {
        f"recall@{j}": [crl_sum["metrics"][f"retrieval/x2y_recall@{j}"],
                        faiss_sum["metrics"][f"x2y_recall@{j}"]]
        for j in (1, 5, k)
    }
    out: dict[str, Any] = {
        "benchmark": "retrieval",
        "quick": quick,
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "config": {"n": n, "dim": dim, "k": k, "block_size": block_size, "dtype": "float32",
                   "crl": "retrieval_metrics(a, b, ks=(1, 5, k)): both directions, all metrics",
                   "faiss": "IndexFlatIP add + search(k), one direction, top-k only",
                   "separate_processes": not quick},
        "environment": {**environment_info(), "faiss-cpu": package_version("faiss-cpu")},
        "machine_before": before,
        "crl": crl_sum,
        "faiss": faiss_sum,
        "time_ratio_crl_vs_faiss": round(ratio, 4),
        "x2y_recall_crl_vs_faiss": agree,
        "machine_after": machine_state(),
    }
    if not quick:
        mem = crl_sum["peak_above_baseline_gib"]
        out["targets"] = {
            "crl time <= 1.5 x faiss": {"value": round(ratio, 4), "met": ratio <= 1.5},
            "crl peak memory < 2 GiB": {"value": mem, "met": mem < 2.0},
        }
    return out


__all__ = ["DIM", "N_FULL", "K", "run_retrieval_benchmark"]
