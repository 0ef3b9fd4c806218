"""``crl bench loss | retrieval``: side-by-side benchmarks, written as JSON.

Results go under ``runs/bench/`` (ignored by git) unless ``--out`` names another file: the
tracked ``benchmarks/results/*.json`` change only when ``--out`` names them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from crl.cli import app
from crl.cli._common import handle_errors

#: Where results go by default: under ``runs/`` (ignored by git), never a tracked file.
BENCH_DIR = Path("runs/bench")

bench_app = typer.Typer(
    help="Benchmarks of crl against the straightforward implementation, side by side.",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")


def _progress(name: str) -> None:
    print(f"running {name} ...", file=sys.stderr, flush=True)


@bench_app.command("loss")
@handle_errors
def loss(
    quick: bool = typer.Option(False, "--quick", help="Seconds-long smoke run (checks it runs)."),
    out: Path = typer.Option(BENCH_DIR / "loss.json", "--out",
                             help="Where to write the JSON results (the tracked "
                                  "benchmarks/results/loss.json only when named here)."),
    batch_sizes: str = typer.Option("", "--batch-sizes",
                                    help="Comma-separated batch sizes (default: 4096,8192,"
                                         "16384,32768,131072; with --quick: 300; with "
                                         "--dtype bf16: 16384)."),
    block_size: int = typer.Option(0, "--block-size", help="Tile side (0: the default)."),
    dtype: str = typer.Option("fp32", "--dtype",
                              help="fp32: tiled vs plain losses; bf16: the tiled loss on "
                                   "bfloat16 vs float32 embeddings, accuracy vs float64."),
) -> None:
    """Tiled vs plain CLIP loss (D = 256, float32): time, peak memory, matmul efficiency;
    with --dtype bf16, bfloat16 vs float32 tiles.

    Example: crl bench loss --quick --dtype bf16 --out /tmp/loss_bf16.json
    """
    from crl.bench import SUITES, format_loss_table, run_loss_benchmark, write_result
    from crl.errors import CrlValueError

    try:
        sizes = [int(s) for s in batch_sizes.split(",") if s.strip()] or None
    except ValueError:
        raise CrlValueError(
            f"crl bench loss: --batch-sizes must be comma-separated integers; got {batch_sizes!r}"
        ) from None
    if dtype not in SUITES:
        raise CrlValueError(f"crl bench loss: --dtype must be {' or '.join(SUITES)}; got "
                            f"{dtype!r}")
    if out == BENCH_DIR / "loss.json":
        out = BENCH_DIR / f"{SUITES[dtype].benchmark}.json"
    result = run_loss_benchmark(dtype=dtype, batch_sizes=sizes, quick=quick,
                                block_size=block_size or None, progress=_progress)
    path = write_result(result, out)
    print(format_loss_table(result))
    if "targets" in result:
        print(json.dumps(result["targets"], indent=2))
    print(f"wrote {path}")


@bench_app.command("retrieval")
@handle_errors
def retrieval(
    quick: bool = typer.Option(False, "--quick", help="Seconds-long smoke run (checks it runs)."),
    out: Path = typer.Option(BENCH_DIR / "retrieval.json", "--out",
                             help="Where to write the JSON results (the tracked "
                                  "benchmarks/results/retrieval.json only when named here)."),
    n: int = typer.Option(100_000, "--n", help="Queries and candidates."),
    block_size: int = typer.Option(1024, "--block-size", help="retrieval_metrics block size."),
) -> None:
    """All retrieval metrics (crl, blockwise) vs a faiss IndexFlatIP top-10 search.

    Example: crl bench retrieval --quick --out /tmp/retrieval.json
    """
    from crl.bench import run_retrieval_benchmark, write_result

    result = run_retrieval_benchmark(n=n, block_size=block_size, quick=quick,
                                     progress=_progress)
    path = write_result(result, out)
    summary = {key: result[key] for key in ("crl", "faiss", "time_ratio_crl_vs_faiss")}
    for key in ("crl", "faiss"):
        summary[key] = {k: v for k, v in summary[key].items() if k != "metrics"}
    print(json.dumps({**summary, "targets": result.get("targets")}, indent=2))
    print(f"wrote {path}")
