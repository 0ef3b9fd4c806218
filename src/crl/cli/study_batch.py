"""``crl study batch``: the in-batch batch size for a config (docs/batch.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from crl.cli._common import handle_errors
from crl.cli._executors import executor_options
from crl.cli.study import (
    _FORCE,
    _KEEP_WEIGHTS,
    _NO_PROGRESS,
    _OUT,
    _PRESET,
    _WORKERS,
    _finish,
    study_app,
)

if TYPE_CHECKING:
    from crl.experiments.executors import Executor


@study_app.command("batch")
@handle_errors
@executor_options
def batch(
    preset: str = _PRESET,
    config: str | None = typer.Option(
        None, "--config", help="A crl train config (YAML or preset) with an in-batch loss (clip, "
        "info_nce, dcl, siglip): its data, model, loss and optimiser stay; the study sets B, "
        "the budget, the micro-batch and the seeds. Default: pycode, bag of tokens, CLIP."),
    metric: str = typer.Option("recall@1", "--metric", help="Summary metric (default: recall@1 "
                               "both ways)."),
    tolerance: str = typer.Option(
        "0.01", "--tolerance", help="How close to the best counts as saturated: points of the "
        "metric (0.01) or a percentage of the best (2%)."),
    batches: str | None = typer.Option(None, "--batches", help="Batch sizes, e.g. 32,64,128."),
    seeds: str | None = typer.Option(None, "--seeds", help="Seeds, e.g. 0,1,2."),
    budget: int | None = typer.Option(None, "--budget", help="Training pairs seen by every run."),
    micro_batch_size: int | None = typer.Option(
        None, "--micro-batch-size", help="Gradient caching for every B above it (default: the "
        "config's train.micro_batch_size, else 256)."),
    num_train: int | None = typer.Option(None, "--num-train", help="Training pairs used."),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda for every run."),
    refine_runs: int | None = typer.Option(
        None, "--refine-runs", help="Run budget of the refinement stage (0: off)."),
    out: Path = _OUT,
    workers: int | None = _WORKERS,
    no_progress: bool = _NO_PROGRESS,
    force: bool = _FORCE,
    keep_weights: bool = _KEEP_WEIGHTS,
    executor: Executor | None = None,
) -> None:
    """How large an in-batch batch for your config? Sweeps B at a fixed sample budget, reads B*
    with its interval, measures each B's memory and time, and writes a report.

    Example: crl study batch --preset quick --out runs
    """
    from crl.experiments.batch import run_batch_study
    from crl.experiments.negatives.grid import parse_list

    outcome, analysis = run_batch_study(
        preset, out=out, workers=workers, progress=not no_progress, executor=executor,
        force=force, keep_weights=keep_weights, config=config, metric=metric,
        tolerance=tolerance, batches=parse_list("--batches", batches, int),
        seeds=parse_list("--seeds", seeds, int), budget=budget,
        micro_batch_size=micro_batch_size, num_train=num_train, device=device,
        refine_runs=refine_runs)
    _finish(outcome.study_dir, analysis)
