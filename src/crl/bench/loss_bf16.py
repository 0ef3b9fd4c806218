"""``crl bench loss --dtype bf16``: the tiled CLIP loss on bfloat16 embeddings against float32.

For each batch size ``B`` (``D = 256``, forward + backward, learnable float32 scale), the tiled
loss (:func:`~crl.losses.clip_loss` with a ``block_size``) runs in two fresh processes on the
same embeddings: float32, and bfloat16 (bf16 tile products, float32 log-sum-exps and
accumulators; :mod:`crl.losses._tiled_kernel`). The bf16 process also computes the loss and its
gradients in float64 on the unrounded embeddings. Reported, all from the same run: wall and CPU
seconds (the machine is shared: its load is recorded beside every measurement, and the CPU time
of a process is less sensitive to other processes than its wall time), the bf16 / float32 time
ratios, the bf16 loss's relative error and gradient cosine similarity against float64, and each
loss's effective throughput ``8 B² D / time`` as a fraction of the matrix-product throughput of
its own dtype, measured at the start and the end of the run (the faster is kept).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from typing import Any

from crl.bench._measure import machine_state, run_tasks
from crl.env import environment_info

#: The batch sizes of the full bf16 benchmark.
BF16_BATCH_SIZES: tuple[int, ...] = (16384,)
#: The quick run (tests): seconds, one process, checks that everything runs.
BF16_QUICK_BATCH_SIZES: tuple[int, ...] = (300,)
DTYPES = ("float32", "bfloat16")


def _loss_task(batch: int, dim: int, dtype: str, block_size: int | None, quick: bool
               ) -> dict[str, Any]:
    repeats, warmup = (1, 0) if quick else (3, 1)
    return {"kind": "loss", "name": f"tiled {dtype} B={batch}", "impl": "tiled", "batch": batch,
            "dim": dim, "dtype": dtype, "block_size": block_size, "repeats": repeats,
            "warmup": warmup, "reference": dtype == "bfloat16"}


def _matmul_tasks(n: int, quick: bool) -> list[dict[str, Any]]:
    return [{"kind": "matmul", "name": f"matmul {dtype} n={n}", "n": n, "dtype": dtype,
             "repeats": 1 if quick else 5} for dtype in DTYPES]


def run_bf16_loss_benchmark(
    *,
    batch_sizes: Sequence[int] | None = None,
    dim: int = 256,
    quick: bool = False,
    block_size: int | None = None,
    matmul_n: int = 4096,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure the tiled loss in bfloat16 and float32 side by side; return JSON-ready results.

    Args:
        batch_sizes: Batch sizes (default :data:`BF16_BATCH_SIZES`, or
            :data:`BF16_QUICK_BATCH_SIZES`).
        dim: Embedding dimension ``D``.
        quick: A seconds-long run for tests: ``D <= 32``, every task in this process, no targets.
        block_size: Tile side (None: the default).
        matmul_n: Side of the square products that measure the matmul throughputs.
        progress: Called with the name of each measurement before it starts.

    Returns:
        A dict with ``config``, ``machine_before``/``machine_after``, ``matmul_gflops`` per
        dtype, one ``rows`` entry per batch size and, for a full run, ``targets``.
    """
    if quick:
        dim, matmul_n = min(dim, 32), 256
    sizes = list(batch_sizes or (BF16_QUICK_BATCH_SIZES if quick else BF16_BATCH_SIZES))
    before = machine_state()
    tasks = _matmul_tasks(matmul_n, quick)
    for batch in sizes:
        tasks += [_loss_task(batch, dim, dtype, block_size, quick) for dtype in DTYPES]
    results = run_tasks(tasks, separate=not quick, progress=progress)
    if not quick:  # again at the end: the load may have changed; the faster one is kept
        results += run_tasks(_matmul_tasks(matmul_n, quick), separate=True, progress=progress)
    gflops = {dtype: max(float(r["gflops"]) for r in results
                         if r["kind"] == "matmul" and r["dtype"] == dtype) for dtype in DTYPES}
    rows = [_row(batch, dim, [r for r in results if r["kind"] == "loss" and r["batch"] == batch],
                 gflops) for batch in sizes]
    out: dict[str, Any] = {
        "benchmark": "loss_bf16",
        "quick": quick,
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "config": {"dim": dim, "dtypes": list(DTYPES), "scale": 1 / 0.07,
                   "block_size": block_size, "batch_sizes": sizes,
                   "flops_per_forward_backward": "8 * B^2 * D",
                   "separate_processes": not quick,
                   "reference": "float64 on the unrounded float32 embeddings"},
        "environment": environment_info(),
        "machine_before": before,
        "matmul_n": matmul_n,
        "matmul_gflops": {k: round(v, 2) for k, v in gflops.items()},
        "matmul_gflops_runs": {dtype: [round(float(r["gflops"]), 2) for r in results
                                       if r["kind"] == "matmul" and r["dtype"] == dtype]
                               for dtype in DTYPES},
        "rows": rows,
        "machine_after": machine_state(),
    }
    if not quick:
        out["targets"] = bf16_targets(rows)
    return out


def _row(batch: int, dim: int, results: list[dict[str, Any]], gflops: dict[str, float]
         ) -> dict[str, Any]:
    """One batch size: both dtypes' figures, the bf16 / float32 ratios and the accuracy."""
    row: dict[str, Any] = {"batch": batch}
    flops = 8.0 * batch * batch * dim
    for res in results:
        dtype = res["dtype"]
        row[dtype] = {key: res[key] for key in ("seconds", "times", "cpu_seconds", "loss",
                                                "grad_norm", "grad_dtype", "scale_grad",
                                                "loadavg_1min_start_end")}
        row[dtype]["gflops"] = round(flops / res["seconds"] / 1e9, 2)
        row[dtype]["fraction_of_matmul"] = round(flops / res["seconds"] / 1e9 / gflops[dtype], 4)
        for key in ("float64_loss", "loss_rel_diff_vs_float64", "grad_cosine_vs_float64",
                    "scale_grad_rel_diff_vs_float64"):
            if key in res:
                row[dtype][key] = res[key]
    low, high = row["bfloat16"], row["float32"]
    row["time_ratio_bf16_vs_float32"] = round(low["seconds"] / high["seconds"], 4)
    row["cpu_time_ratio_bf16_vs_float32"] = round(low["cpu_seconds"] / high["cpu_seconds"], 4)
    row["float32_loss_rel_diff_vs_float64"] = abs(high["loss"] - low["float64_loss"]) / abs(
        low["float64_loss"])
    return row


def bf16_targets(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The bf16 targets at B = 16,384 (when run), each with its measured value and whether it
    is met; the throughput fraction is reported, with no target."""
    targets: dict[str, Any] = {}
    row = next((r for r in rows if r["batch"] == 16384), None)
    if row is None:
        return targets
    low = row["bfloat16"]
    ratio = row["time_ratio_bf16_vs_float32"]
    targets["B=16384 bf16 time <= 0.6 x float32 tiled (same run)"] = {
        "value": ratio, "cpu_time_ratio": row["cpu_time_ratio_bf16_vs_float32"],
        "met": ratio <= 0.6}
    targets["B=16384 bf16 loss within 1e-2 relative of float64"] = {
        "value": low["loss_rel_diff_vs_float64"], "met": low["loss_rel_diff_vs_float64"] <= 1e-2}
    targets["B=16384 bf16 gradient cosine >= 0.999 vs float64"] = {
        "value": low["grad_cosine_vs_float64"], "met": low["grad_cosine_vs_float64"] >= 0.999}
    targets["B=16384 bf16 effective throughput, fraction of bf16 matmul"] = {
        "value": low["fraction_of_matmul"], "met": None}
    return targets


def format_bf16_table(result: dict[str, Any]) -> str:
    """A Markdown table of a bf16 loss benchmark result (as quoted in the README)."""
    lines = [
        "| B | float32 s (CPU s) | bf16 s (CPU s) | bf16/float32 wall (CPU) | bf16 loss vs float64 "
        "| grad cosine | float32 of its matmul | bf16 of its matmul | load (1 min) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        high, low = row["float32"], row["bfloat16"]
        load = [x for x in (*high["loadavg_1min_start_end"], *low["loadavg_1min_start_end"])
                if x is not None]
        lines.append(
            f"| {row['batch']:,} | {high['seconds']:.3g} ({high['cpu_seconds']:.3g}) | "
            f"{low['seconds']:.3g} ({low['cpu_seconds']:.3g}) | "
            f"{row['time_ratio_bf16_vs_float32']:.2f} ({row['cpu_time_ratio_bf16_vs_float32']:.2f})"
            f" | {low['loss_rel_diff_vs_float64']:.1e} | {low['grad_cosine_vs_float64']:.5f} | "
            f"{high['fraction_of_matmul']:.0%} | {low['fraction_of_matmul']:.0%} | "
            f"{min(load):.1f}-{max(load):.1f} |")
    return "\n".join(lines)


__all__ = [
    "BF16_BATCH_SIZES",
    "BF16_QUICK_BATCH_SIZES",
    "bf16_targets",
    "format_bf16_table",
    "run_bf16_loss_benchmark",
]
