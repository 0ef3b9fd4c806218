"""Side-by-side benchmarks of crl against the straightforward implementation (``crl bench``).

Each measurement runs in a fresh process (:mod:`crl.bench._measure`) so its peak memory is its
own; results are JSON-ready dicts, written by the CLI under ``runs/bench/`` or to ``--out``.
"""

from crl.bench.loss import SUITES, format_loss_table, run_loss_benchmark, write_result
from crl.bench.retrieval import run_retrieval_benchmark

__all__ = [
    "SUITES",
    "format_loss_table",
    "run_loss_benchmark",
    "run_retrieval_benchmark",
    "write_result",
]
