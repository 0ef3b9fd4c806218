"""Side-by-side benchmarks of crl against the straightforward implementation (``crl bench``).

Each measurement runs in a fresh process (:mod:`crl.bench._measure`) so its peak memory is its
own; results are JSON-ready dicts, written to ``benchmarks/results/*.json`` by the CLI.
"""

from crl.bench.loss import format_loss_table, run_loss_benchmark, write_result
from crl.bench.retrieval import run_retrieval_benchmark

__all__ = ["format_loss_table", "run_loss_benchmark", "run_retrieval_benchmark", "write_result"]
