"""``crl bench loss [--dtype fp32|bf16]``: the CLIP loss, forward + backward, side by side.

One benchmark with a dtype axis (:data:`SUITES`). For each batch size ``B`` (``D = 256``,
unit-norm embeddings, learnable float32 scale ``1/0.07``) the entries of the chosen dtype run in
separate fresh processes on the same embeddings, the last entry (the subject) compared with each
of the others:

- ``fp32``: open_clip's ``ClipLoss`` formula (two products and two cross-entropies, written out
  in :mod:`crl.bench._worker`), crl's plain :func:`~crl.losses.clip_loss` path, and the tiled
  one (``block_size`` set), all in float32;
- ``bf16``: the tiled loss on float32 and on bfloat16 embeddings (bf16 tile products, float32
  log-sum-exps and accumulators; :mod:`crl.losses._tiled_kernel`); the bf16 process also
  computes the loss and its gradients in float64 on the unrounded embeddings.

Reported per entry: wall and CPU seconds (the machine is shared: its load is recorded beside
every measurement, and a process's CPU time is less sensitive to other processes than its wall
time), peak resident memory above the interpreter's baseline, the loss, gradient norm and scale
gradient (they must agree), and the effective throughput ``8 B² D / time`` as a fraction of the
matrix-product throughput of its own dtype, measured at the start and (full runs) the end, the
faster kept. Per row: the subject's time, CPU-time and memory ratios and relative loss difference
against each other entry, and the accuracy against float64 where it was computed. A plain run
whose ``(B, B)`` buffers would not fit in the available memory is skipped and says how much it
would need. The full runs' targets: :mod:`crl.bench.targets`.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from crl._validation import check_choice
from crl.bench._measure import GIB, available_memory, machine_state, run_tasks
from crl.bench.targets import bf16_targets, loss_targets
from crl.env import BF16_MATRIX_FLAGS, cpu_info, environment_info
from crl.errors import CrlValueError

#: The batch sizes of the full float32 benchmark.
BATCH_SIZES: tuple[int, ...] = (4096, 8192, 16384, 32768, 131072)
#: The batch sizes of the full bf16 benchmark.
BF16_BATCH_SIZES: tuple[int, ...] = (16384,)
#: The quick run: small enough for the test suite; checks that everything runs, not speed.
QUICK_BATCH_SIZES: tuple[int, ...] = (300,)
#: Bytes the plain losses hold at their peak, per ``B²`` entry (measured at B = 32,768: open_clip's
#: formula peaks at 16.1 GiB, four float32 ``B x B`` matrices; crl's plain path, which also saves
#: ``a @ b.T`` for the scale's gradient and copies the transposed logits, went past 19.4 GiB).
PLAIN_BYTES_PER_ENTRY = {"open_clip": 4 * 4, "plain": 6 * 4}
#: Memory left to the rest of the machine when deciding whether a plain run fits.
MEMORY_MARGIN = 3 * GIB
#: Timed runs of each reference product: the separate processes' and each loss process's own.
MATMUL_REPEATS = 5
#: Keys of a worker's loss result kept in a row's entry, and those kept where present (its
#: float64 reference; the backward route of narrow-dtype tiles).
_MEASURED = ("seconds", "times", "cpu_seconds", "loss", "grad_norm", "grad_dtype", "scale_grad",
             "loadavg_1min_start_end", "matmul_gflops_same_process")
_OPTIONAL = ("float64_loss", "loss_rel_diff_vs_float64", "grad_cosine_vs_float64",
             "scale_grad_rel_diff_vs_float64", "backward_route")


class Entry(NamedTuple):
    """One measured loss of a suite: ``key`` names it in a row, ``impl`` is the worker's loss
    (``open_clip``, ``plain`` or ``tiled``), ``dtype`` its embeddings' dtype, and ``reference``
    whether its process also computes the loss in float64."""

    key: str
    impl: str
    dtype: str
    reference: bool = False


class LossSuite(NamedTuple):
    """One value of the dtype axis.

    Attributes:
        benchmark: The JSON's ``benchmark`` (and the CLI's default file name).
        entries: What runs at each batch size; the last is the subject, compared with the others.
        label: The subject's name in the row's comparisons (``time_ratio_{label}_vs_{key}``).
        batch_sizes: The full run's default batch sizes.
        repeated_up_to: Batch sizes up to this one (None: every one) take the best of 3 runs
            after a warm-up in a full run, larger ones one run.
        targets: The full run's targets, from its rows.
    """

    benchmark: str
    entries: tuple[Entry, ...]
    label: str
    batch_sizes: tuple[int, ...]
    repeated_up_to: int | None
    targets: Callable[[Sequence[dict[str, Any]]], dict[str, Any]]


#: The dtype axis of ``crl bench loss --dtype``.
SUITES: dict[str, LossSuite] = {
    "fp32": LossSuite("loss", (Entry("open_clip", "open_clip", "float32"),
                               Entry("plain", "plain", "float32"),
                               Entry("tiled", "tiled", "float32")),
                      "tiled", BATCH_SIZES, 16384, loss_targets),
    "bf16": LossSuite("loss_bf16", (Entry("float32", "tiled", "float32"),
                                    Entry("bfloat16", "tiled", "bfloat16", reference=True)),
                      "bf16", BF16_BATCH_SIZES, None, bf16_targets),
}


def plain_memory_estimate(batch: int, impl: str = "open_clip") -> int:
    """Bytes plain loss ``impl`` (``open_clip`` or ``plain``) needs at batch size ``batch``."""
    return PLAIN_BYTES_PER_ENTRY[impl] * batch * batch


def _dtypes(suite: LossSuite) -> list[str]:
    """The suite's embedding dtypes, each once, in entry order."""
    return list(dict.fromkeys(entry.dtype for entry in suite.entries))


def _loss_task(suite: LossSuite, entry: Entry, batch: int, dim: int, block_size: int | None,
               quick: bool, matmul_n: int) -> dict[str, Any]:
    """One loss process; outside ``quick`` it also measures the ``matmul_n`` product's rate
    before and after its timing (``fraction_of_same_process_matmul``)."""
    repeated = suite.repeated_up_to is None or batch <= suite.repeated_up_to
    repeats, warmup = (3, 1) if repeated and not quick else (1, 0)
    return {"kind": "loss", "name": f"{entry.impl} {entry.dtype} B={batch}", "key": entry.key,
            "impl": entry.impl, "batch": batch, "dim": dim, "dtype": entry.dtype,
            "block_size": block_size, "repeats": repeats, "warmup": warmup,
            "reference": entry.reference, "matmul_n": None if quick else matmul_n,
            "matmul_repeats": MATMUL_REPEATS}


def _matmul_tasks(suite: LossSuite, n: int, quick: bool) -> list[dict[str, Any]]:
    return [{"kind": "matmul", "name": f"matmul {dtype} n={n}", "n": n, "dtype": dtype,
             "repeats": 1 if quick else MATMUL_REPEATS} for dtype in _dtypes(suite)]


def _skip_reason(entry: Entry, batch: int) -> str | None:
    """Why a plain entry is not started: its ``(B, B)`` buffers would not fit in the memory
    available now (asked just before the run: the machine is shared); None when it fits."""
    if entry.impl not in PLAIN_BYTES_PER_ENTRY:
        return None
    free = available_memory()
    need = plain_memory_estimate(batch, entry.impl)
    if free is None or need + MEMORY_MARGIN <= free:
        return None
    return (f"skipped: would need about {need / GIB:.1f} GiB for its (B, B) buffers; "
            f"{free / GIB:.1f} GiB available")


def run_loss_benchmark(
    *,
    dtype: str = "fp32",
    batch_sizes: Sequence[int] | None = None,
    dim: int = 256,
    quick: bool = False,
    block_size: int | None = None,
    matmul_n: int = 4096,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure the losses of one dtype (:data:`SUITES`) side by side; return JSON-ready results.

    Args:
        dtype: ``"fp32"`` (open_clip, plain and tiled in float32) or ``"bf16"`` (the tiled loss
            on float32 and bfloat16 embeddings, accuracy against float64).
        batch_sizes: Batch sizes (default the suite's, or :data:`QUICK_BATCH_SIZES`).
        dim: Embedding dimension ``D``.
        quick: A seconds-long run for tests: small sizes, ``D <= 32``, every task in this
            process (so the memory figures are not separate), no targets.
        block_size: Tile side of the tiled loss (None: its default).
        matmul_n: Side of the square products that measure the matmul throughputs.
        progress: Called with the name of each measurement before it starts.

    Returns:
        A dict with ``config``, ``machine_before``/``machine_after``, ``matmul_gflops`` (a
        number for a suite of one dtype, else per dtype), one ``rows`` entry per batch size and,
        for a full run, ``targets``.

    Raises:
        CrlValueError: for a ``dtype`` not in :data:`SUITES`, or a full ``bf16`` run on a CPU
            without bfloat16 matrix instructions (its bf16 products are emulated, about 1
            GFLOP/s: the run would take hours and measure the emulation).
    """
    suite = SUITES[check_choice("run_loss_benchmark", "dtype", dtype, SUITES)]
    if not quick and "bfloat16" in _dtypes(suite) and cpu_info()["bf16_matrix_units"] is False:
        raise CrlValueError(
            f"run_loss_benchmark: dtype={dtype!r} needs a CPU with bfloat16 matrix instructions "
            f"(one of {', '.join(BF16_MATRIX_FLAGS)}); this one "
            f"({cpu_info()['cpu_model']}, {cpu_info()['cpu_capability']}) has none, so its bf16 "
            "products are emulated; run dtype='fp32', or --quick to check that it runs")
    if quick:
        dim, matmul_n = min(dim, 32), 256
    sizes = list(batch_sizes or (QUICK_BATCH_SIZES if quick else suite.batch_sizes))
    before = machine_state()
    planned = [(entry, _loss_task(suite, entry, batch, dim, block_size, quick, matmul_n))
               for batch in sizes for entry in suite.entries]
    skipped: dict[tuple[int, str], str] = {}
    if quick:
        results = run_tasks(_matmul_tasks(suite, matmul_n, quick) + [t for _, t in planned],
                            separate=False, progress=progress)
    else:
        results = run_tasks(_matmul_tasks(suite, matmul_n, quick), separate=True,
                            progress=progress)
        for entry, task in planned:
            reason = _skip_reason(entry, task["batch"])
            if reason is not None:
                skipped[(task["batch"], entry.key)] = reason
                continue
            results += run_tasks([task], separate=True, progress=progress)
        # again at the end: the load may have changed; the faster one is kept
        results += run_tasks(_matmul_tasks(suite, matmul_n, quick), separate=True,
                             progress=progress)
    runs = {dtype: [float(r["gflops"]) for r in results
                    if r["kind"] == "matmul" and r["dtype"] == dtype] for dtype in _dtypes(suite)}
    gflops = {dtype: max(values) for dtype, values in runs.items()}
    rows = [_row(suite, batch, dim, [r for r in results if r["kind"] == "loss"
                                     and r["batch"] == batch], skipped, gflops)
            for batch in sizes]
    config: dict[str, Any] = {"dim": dim, "dtype": suite.entries[-1].dtype,
                              "dtypes": _dtypes(suite), "scale": 1 / 0.07,
                              "block_size": block_size, "batch_sizes": sizes,
                              "flops_per_forward_backward": "8 * B^2 * D",
                              "separate_processes": not quick}
    if any(entry.reference for entry in suite.entries):
        config["reference"] = "float64 on the unrounded float32 embeddings"
    out: dict[str, Any] = {
        "benchmark": suite.benchmark,
        "quick": quick,
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "config": config,
        "environment": environment_info(),
        "machine_before": before,
        "matmul_n": matmul_n,
        "matmul_gflops": _per_dtype({k: round(v, 2) for k, v in gflops.items()}),
        "matmul_gflops_runs": _per_dtype({k: [round(v, 2) for v in values]
                                          for k, values in runs.items()}),
        "rows": rows,
        "machine_after": machine_state(),
    }
    if not quick:
        out["targets"] = suite.targets(rows)
    return out


def _per_dtype(values: dict[str, Any]) -> Any:
    """``values`` by dtype, or its one value when there is one dtype."""
    return next(iter(values.values())) if len(values) == 1 else values


def _row(suite: LossSuite, batch: int, dim: int, results: list[dict[str, Any]],
         skipped: dict[tuple[int, str], str], gflops: dict[str, float]) -> dict[str, Any]:
    """One batch size: each entry's figures, then the subject against each other entry."""
    row: dict[str, Any] = {"batch": batch}
    flops = 8.0 * batch * batch * dim
    for res in results:
        entry = {key: res[key] for key in _MEASURED}
        entry["peak_above_baseline_gib"] = round((res["peak_rss"] - res["baseline_rss"]) / GIB, 4)
        entry["baseline_rss_gib"] = round(res["baseline_rss"] / GIB, 4)
        entry["gflops"] = round(flops / res["seconds"] / 1e9, 2)
        entry["fraction_of_matmul"] = round(flops / res["seconds"] / 1e9 / gflops[res["dtype"]],
                                            4)
        own = res.get("matmul_gflops_same_process")
        if own:  # the faster of the products measured just before and after, in its process
            entry["fraction_of_same_process_matmul"] = round(
                flops / res["seconds"] / 1e9 / max(own), 4)
        entry.update({key: res[key] for key in _OPTIONAL if key in res})
        row[res["key"]] = entry
    for (size, key), reason in skipped.items():
        if size == batch:
            row[key] = {"skipped": reason}
    subject, label = row[suite.entries[-1].key], suite.label
    row[f"{label}_gflops"] = subject["gflops"]
    row[f"{label}_fraction_of_matmul"] = subject["fraction_of_matmul"]
    for other in suite.entries[:-1]:
        base = row[other.key]
        if "seconds" not in base:
            continue
        row[f"time_ratio_{label}_vs_{other.key}"] = round(subject["seconds"] / base["seconds"], 4)
        row[f"cpu_time_ratio_{label}_vs_{other.key}"] = round(
            subject["cpu_seconds"] / base["cpu_seconds"], 4)
        row[f"memory_ratio_{label}_vs_{other.key}"] = round(
            subject["peak_above_baseline_gib"] / max(base["peak_above_baseline_gib"], 1e-9), 4)
        row[f"loss_rel_diff_vs_{other.key}"] = abs(subject["loss"] - base["loss"]) / abs(
            base["loss"])
        if "float64_loss" in subject:
            exact = subject["float64_loss"]
            row[f"{other.key}_loss_rel_diff_vs_float64"] = abs(base["loss"] - exact) / abs(exact)
    return row


def format_loss_table(result: dict[str, Any]) -> str:
    """A Markdown table of a loss benchmark result: per entry its seconds (CPU seconds), peak
    memory and fraction of its dtype's matmul; the subject's ratios against the others, its
    throughput, its accuracy against float64 (where computed); the load."""
    suite = next(s for s in SUITES.values() if s.benchmark == result["benchmark"])
    keys, label = [entry.key for entry in suite.entries], suite.label
    header = ([f"{key} s (CPU s)" for key in keys] + [f"{label}/{key} (CPU)" for key in keys[:-1]]
              + [f"{key} GiB" for key in keys] + [f"{label} GFLOP/s"]
              + [f"{key} of matmul" for key in keys]
              + ([f"{label} loss vs float64", "grad cosine"] if suite.entries[-1].reference
                 else []) + ["load (1 min)"])
    lines = ["| B | " + " | ".join(header) + " |", "|---:" * (len(header) + 1) + "|"]
    lines += [f"| {row['batch']:,} | " + " | ".join(_cells(suite, row)) + " |"
              for row in result["rows"]]
    return "\n".join(lines)


def _cells(suite: LossSuite, row: dict[str, Any]) -> list[str]:
    """The cells of :func:`format_loss_table` for one row, after its batch size."""
    label = suite.label
    entries = [row[entry.key] for entry in suite.entries]

    def each(fmt: str, *keys: str) -> list[str]:
        return [fmt.format(*(e[k] for k in keys)) if "seconds" in e else "skipped"
                for e in entries]

    ratios = []
    for other in suite.entries[:-1]:
        wall = row.get(f"time_ratio_{label}_vs_{other.key}")
        cpu = row.get(f"cpu_time_ratio_{label}_vs_{other.key}")
        ratios.append("-" if wall is None else f"{wall:.2f} ({cpu:.2f})")
    subject = entries[-1]
    accuracy = ([f"{subject['loss_rel_diff_vs_float64']:.1e}",
                 f"{subject['grad_cosine_vs_float64']:.5f}"] if suite.entries[-1].reference
                else [])
    load = [x for e in entries if "seconds" in e for x in e["loadavg_1min_start_end"]
            if x is not None]
    return (each("{:.3g} ({:.3g})", "seconds", "cpu_seconds") + ratios
            + each("{:.3g}", "peak_above_baseline_gib") + [f"{row[f'{label}_gflops']:.1f}"]
            + each("{:.0%}", "fraction_of_matmul") + accuracy
            + [f"{min(load):.1f}-{max(load):.1f}" if load else "-"])


def write_result(result: dict[str, Any], path: str | Path) -> Path:
    """Write ``result`` as indented JSON to ``path`` (creating its folder); return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return target


__all__ = [
    "BATCH_SIZES",
    "BF16_BATCH_SIZES",
    "QUICK_BATCH_SIZES",
    "SUITES",
    "Entry",
    "LossSuite",
    "format_loss_table",
    "plain_memory_estimate",
    "run_loss_benchmark",
    "write_result",
]
