"""``crl bench loss``: the tiled CLIP loss against the plain ``(B, B)`` one, side by side.

For each batch size ``B`` (``D = 256``, float32, forward + backward, learnable scale), three
implementations run in separate fresh processes: open_clip's ``ClipLoss`` formula (two products
and two cross-entropies, written out in :mod:`crl.bench._worker`), crl's plain
:func:`~crl.losses.clip_loss` path, and :func:`~crl.losses.tiled_clip_loss`. Reported: time, peak
resident memory above the interpreter's baseline, the ratios, the loss values (they must agree),
and the tiled loss's effective throughput ``8 B² D / time`` as a fraction of this machine's
float32 matrix-product throughput measured in the same run. A plain run whose ``(B, B)`` buffers
would not fit in the available memory is skipped and says how much it would need.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from crl.bench._measure import GIB, available_memory, machine_state, run_tasks
from crl.env import environment_info

#: The batch sizes of the full benchmark.
BATCH_SIZES: tuple[int, ...] = (4096, 8192, 16384, 32768, 131072)
#: The quick run: small enough for the test suite; checks that everything runs, not speed.
QUICK_BATCH_SIZES: tuple[int, ...] = (300,)
PLAIN_IMPLS = ("open_clip", "plain")
#: Bytes the plain losses hold at their peak, per ``B²`` entry (measured at B = 32,768: open_clip's
#: formula peaks at 16.1 GiB, four float32 ``B x B`` matrices; crl's plain path, which also saves
#: ``a @ b.T`` for the scale's gradient and copies the transposed logits, went past 19.4 GiB).
PLAIN_BYTES_PER_ENTRY = {"open_clip": 4 * 4, "plain": 6 * 4}
#: Memory left to the rest of the machine when deciding whether a plain run fits.
MEMORY_MARGIN = 3 * GIB


def plain_memory_estimate(batch: int, impl: str = "open_clip") -> int:
    """Bytes plain loss ``impl`` (``open_clip`` or ``plain``) needs at batch size ``batch``."""
    return PLAIN_BYTES_PER_ENTRY[impl] * batch * batch


def _tasks(batch: int, dim: int, impls: Sequence[str], block_size: int | None,
           quick: bool) -> list[dict[str, Any]]:
    small = batch <= 8192
    repeats, warmup = (1, 0) if quick else ((3, 1) if small else (1, 0))
    return [{"kind": "loss", "name": f"{impl} B={batch}", "impl": impl, "batch": batch,
             "dim": dim, "block_size": block_size, "repeats": repeats, "warmup": warmup}
            for impl in impls]


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "seconds": round(result["seconds"], 4),
        "times": [round(t, 4) for t in result["times"]],
        "peak_above_baseline_gib": round((result["peak_rss"] - result["baseline_rss"]) / GIB, 4),
        "baseline_rss_gib": round(result["baseline_rss"] / GIB, 4),
        "loss": result["loss"],
        "grad_norm": result["grad_norm"],
        "scale_grad": result["scale_grad"],
    }


def run_loss_benchmark(
    *,
    batch_sizes: Sequence[int] | None = None,
    dim: int = 256,
    quick: bool = False,
    block_size: int | None = None,
    matmul_n: int = 4096,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure plain and tiled CLIP losses side by side; return the JSON-ready results.

    Args:
        batch_sizes: Batch sizes (default :data:`BATCH_SIZES`, or :data:`QUICK_BATCH_SIZES`).
        dim: Embedding dimension ``D``.
        quick: A seconds-long run for tests: small sizes, ``D = 32``, every task in one process
            (so the memory figures are not separate), no targets.
        block_size: Tile side of the tiled loss (None: its default).
        matmul_n: Side of the square product that measures the matmul throughput.
        progress: Called with the name of each measurement before it starts.

    Returns:
        A dict with ``config``, ``machine_before``/``machine_after``, ``matmul_gflops``, one
        ``rows`` entry per batch size and, for a full run, ``targets``.
    """
    if quick:
        batch_sizes = batch_sizes or QUICK_BATCH_SIZES
        dim, matmul_n = min(dim, 32), 256
    sizes = list(batch_sizes or BATCH_SIZES)
    before = machine_state()
    matmul_task = {"kind": "matmul", "name": f"matmul n={matmul_n}", "n": matmul_n,
                   "repeats": 1 if quick else 5}
    skipped: dict[tuple[int, str], str] = {}
    if quick:
        tasks = [matmul_task]
        for batch in sizes:
            tasks += _tasks(batch, dim, [*PLAIN_IMPLS, "tiled"], block_size, quick)
        results = run_tasks(tasks, separate=False, progress=progress)
    else:
        results = run_tasks([matmul_task], separate=True, progress=progress)
        for batch in sizes:
            for impl in [*PLAIN_IMPLS, "tiled"]:
                free = available_memory()  # asked just before the run: the machine is shared
                need = 0 if impl == "tiled" else plain_memory_estimate(batch, impl)
                if free is not None and need + MEMORY_MARGIN > free:
                    skipped[(batch, impl)] = (
                        f"skipped: would need about {need / GIB:.1f} GiB for its (B, B) "
                        f"buffers; {free / GIB:.1f} GiB available"
                    )
                    continue
                results += run_tasks(_tasks(batch, dim, [impl], block_size, quick),
                                     separate=True, progress=progress)
    matmul_runs = [float(results[0]["gflops"])]
    if not quick:  # again at the end: the load may have changed; the faster one is kept
        matmul_runs.append(float(run_tasks([matmul_task], separate=True)[0]["gflops"]))
    gflops = max(matmul_runs)
    rows = []
    for batch in sizes:
        row: dict[str, Any] = {"batch": batch}
        for res in results[1:]:
            if res["batch"] == batch:
                row[res["impl"]] = _summary(res)
        for impl in PLAIN_IMPLS:
            if (batch, impl) in skipped:
                row[impl] = {"skipped": skipped[(batch, impl)]}
        tiled = row["tiled"]
        flops = 8.0 * batch * batch * dim
        row["tiled_gflops"] = round(flops / tiled["seconds"] / 1e9, 2)
        row["tiled_fraction_of_matmul"] = round(flops / tiled["seconds"] / 1e9 / gflops, 4)
        for impl in PLAIN_IMPLS:
            base = row[impl]
            if "seconds" in base:
                row[f"time_ratio_tiled_vs_{impl}"] = round(tiled["seconds"] / base["seconds"], 4)
                row[f"memory_ratio_tiled_vs_{impl}"] = round(
                    tiled["peak_above_baseline_gib"] / max(base["peak_above_baseline_gib"],
                                                           1e-9), 4)
                row[f"loss_rel_diff_vs_{impl}"] = abs(tiled["loss"] - base["loss"]) / abs(
                    base["loss"])
        rows.append(row)
    out: dict[str, Any] = {
        "benchmark": "loss",
        "quick": quick,
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "config": {"dim": dim, "dtype": "float32", "scale": 1 / 0.07,
                   "block_size": block_size, "batch_sizes": sizes,
                   "flops_per_forward_backward": "8 * B^2 * D",
                   "separate_processes": not quick},
        "environment": environment_info(),
        "machine_before": before,
        "matmul_n": matmul_n,
        "matmul_gflops": round(gflops, 2),
        "matmul_gflops_start_end": [round(g, 2) for g in matmul_runs],
        "rows": rows,
        "machine_after": machine_state(),
    }
    if not quick:
        out["targets"] = loss_targets(rows)
    return out


def _row(rows: Sequence[dict[str, Any]], batch: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["batch"] == batch), None)


def _plain_ratio(row: dict[str, Any]) -> tuple[float | None, str | None]:
    """Tiled time over crl's plain time, or over open_clip's when the plain run did not fit."""
    for impl in PLAIN_IMPLS[::-1]:
        ratio = row.get(f"time_ratio_tiled_vs_{impl}")
        if ratio is not None:
            return float(ratio), impl
    return None, None


def loss_targets(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The benchmark's targets, each with the measured value and whether it is met (None: the
    size was not run or no plain baseline fitted); ``baseline`` names the plain run compared."""
    targets: dict[str, Any] = {}
    big, mid, huge = _row(rows, 32768), _row(rows, 8192), _row(rows, 131072)
    if big is not None:
        mem = big["tiled"]["peak_above_baseline_gib"]
        targets["B=32768 tiled peak memory < 1 GiB above baseline"] = {"value": mem,
                                                                       "met": mem < 1.0}
        ratio, base = _plain_ratio(big)
        targets["B=32768 tiled time <= 0.6 x plain"] = {
            "value": ratio, "baseline": base, "met": None if ratio is None else ratio <= 0.6}
    if mid is not None:
        ratio, base = _plain_ratio(mid)
        targets["B=8192 tiled time <= 1.0 x plain"] = {
            "value": ratio, "baseline": base, "met": None if ratio is None else ratio <= 1.0}
    if huge is not None:
        targets["B=131072 tiled completes"] = {"value": huge["tiled"]["seconds"], "met": True}
    fractions = {r["batch"]: r["tiled_fraction_of_matmul"] for r in rows if r["batch"] >= 16384}
    if fractions:
        targets["tiled >= 50% of matmul throughput at B >= 16384"] = {
            "value": fractions, "met": all(f >= 0.5 for f in fractions.values())}
    return targets


def format_loss_table(result: dict[str, Any]) -> str:
    """A Markdown table of a loss benchmark result (as quoted in the README)."""
    lines = [
        "| B | open_clip s | plain s | tiled s | tiled/plain | open_clip GiB | plain GiB "
        "| tiled GiB | tiled GFLOP/s | of matmul |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(entry: dict[str, Any], key: str) -> str:
        return f"{entry[key]:.3g}" if key in entry else "skipped"

    for row in result["rows"]:
        ratio = row.get("time_ratio_tiled_vs_plain")
        lines.append(
            f"| {row['batch']:,} | {cell(row['open_clip'], 'seconds')} | "
            f"{cell(row['plain'], 'seconds')} | {row['tiled']['seconds']:.3g} | "
            f"{'-' if ratio is None else f'{ratio:.2f}'} | "
            f"{cell(row['open_clip'], 'peak_above_baseline_gib')} | "
            f"{cell(row['plain'], 'peak_above_baseline_gib')} | "
            f"{row['tiled']['peak_above_baseline_gib']:.3g} | {row['tiled_gflops']:.1f} | "
            f"{row['tiled_fraction_of_matmul']:.0%} |"
        )
    return "\n".join(lines)


def write_result(result: dict[str, Any], path: str | Path) -> Path:
    """Write ``result`` as indented JSON to ``path`` (creating its folder); return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return target


__all__ = [
    "BATCH_SIZES",
    "QUICK_BATCH_SIZES",
    "format_loss_table",
    "loss_targets",
    "plain_memory_estimate",
    "run_loss_benchmark",
    "write_result",
]
