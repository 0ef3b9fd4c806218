"""Side-by-side benchmarks of crl against the straightforward implementation (``crl bench``).

Each measurement runs in a fresh process (:mod:`crl.bench._measure`) so its peak memory is its
own; results are JSON-ready dicts, written by the CLI under ``runs/bench/`` or to ``--out``.
"""

from crl.bench.loss import format_loss_table, run_loss_benchmark, write_result
from crl.bench.loss_bf16 import format_bf16_table, run_bf16_loss_benchmark
from crl.bench.retrieval import run_retrieval_benchmark

__all__ = [
    "format_bf16_table",
    "format_loss_table",
    "run_bf16_loss_benchmark",
    "run_loss_benchmark",
    "run_retrieval_benchmark",
    "write_result",
]
