"""``crl study NAME`` and ``crl report STUDY_DIR``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from crl.cli import app
from crl.cli._common import handle_errors
from crl.cli._executors import executor_options

if TYPE_CHECKING:
    from crl.experiments.executors import Executor
    from crl.experiments.study import Analysis

study_app = typer.Typer(help="Run a study: a grid of runs plus an analysis and a report.",
                        no_args_is_help=True)
app.add_typer(study_app, name="study")

_PRESET = typer.Option("quick", "--preset",
                       help="smoke (under a minute), quick (under 10 minutes), full (hours).")
_OUT = typer.Option(Path("runs"), "--out", help="Parent directory of the study directory.")
_WORKERS = typer.Option(None, "--workers", help="Parallel runs (default: number of cores).")
_NO_PROGRESS = typer.Option(False, "--no-progress", help="Hide the progress bar.")
_KEEP_WEIGHTS = typer.Option(
    False, "--keep-weights", help="Keep every finished run's checkpoint.pt (its weights; "
    "default: a run keeps it only while it trains, and a finished run keeps its summary, "
    "metrics and config).")
_FORCE = typer.Option(False, "--force", help="Run even though the study directory records other "
                      "options (its study.json): record these instead; finished runs of equal "
                      "configs are kept and reused.")


def _finish(study_dir: Path, analysis: Analysis, *, headline: bool = True) -> None:
    """The headline and the study's closing lines, a warning on stderr for finished runs that
    cannot be read, the report."""
    from crl.experiments.report import REPORT_FILE, unreadable_text

    if headline:
        print(analysis.headline)
        if analysis.closing:
            print(analysis.closing)
    if analysis.unreadable:
        print(f"warning: {unreadable_text(analysis.unreadable)}", file=sys.stderr)
    print(f"report: {study_dir / REPORT_FILE}")


@study_app.command("negatives")
@handle_errors
@executor_options
def negatives(
    preset: str = _PRESET,
    data: str = typer.Option("pycode", "--data", help="pycode, digits, synthetic, or a FILE "
                             "(not with --config: the config names its data)."),
    model: str | None = typer.Option(None, "--model", help="Model kind (default per data)."),
    metric: str | None = typer.Option(
        None, "--metric", help="Summary metric to fit (default: recall@1; digits: probe/knn_acc)."),
    tolerance: str = typer.Option(
        "0.01", "--tolerance", help="How close to the best counts as saturated: points of the "
        "metric (0.01) or a percentage of the best (2%)."),
    temperature: float | None = typer.Option(
        None, "--temperature", help="GCL temperature (default 0.05; with --config, its own)."),
    config: str | None = typer.Option(
        None, "--config", help="A crl train config (YAML or preset) to sweep: its data, model, "
        "loss with its options and optimiser stay; the study sets n, m, seeds, budget and "
        "batch. A loss without negative sets (in-batch only) is refused unless --loss."),
    loss: str | None = typer.Option(
        None, "--loss", help="The loss to train, one that takes negative sets (default: the "
        "config's, or gcl)."),
    ns: str | None = typer.Option(None, "--ns", help="Anchors n, e.g. 500,1500,4000."),
    fractions: str | None = typer.Option(None, "--fractions", help="m/n, e.g. 0.1,0.4,1."),
    seeds: str | None = typer.Option(None, "--seeds", help="Seeds, e.g. 0,1,2,3."),
    budget: int | None = typer.Option(None, "--budget", help="Processed samples per run."),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Batch size of every run."),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda for every run."),
    target_n: int | None = typer.Option(
        None, "--target-n", help="The n to recommend m for (default: the whole training split)."),
    refine_runs: int | None = typer.Option(
        None, "--refine-runs", help="Run budget of the refinement stage (0: off)."),
    target_epochs: float | None = typer.Option(
        None, "--target-epochs", help="The training you plan: every n trains this many epochs "
        "(default: the preset's samples per run)."),
    target_samples: int | None = typer.Option(
        None, "--target-samples", help="The training you plan: every run processes this many "
        "samples (the same as --budget; default: the preset's)."),
    verify: bool | None = typer.Option(
        None, "--verify/--no-verify", help="Train the recommendation at the target n at "
        "m/2, m, 2m and the largest m (default: on in the full preset)."),
    verify_seeds: int | None = typer.Option(
        None, "--verify-seeds", help="Seeds of the verify stage: the grid's, topped up to this "
        "many (default 5, at least 3)."),
    control: bool | None = typer.Option(
        None, "--control/--no-control", help="A control arm: the same m at a batch 4 times "
        "smaller, to tell m from the negatives per step (default: on in the full preset)."),
    control_n: int | None = typer.Option(
        None, "--control-n", help="The n of the control arm (one of --ns; default the largest)."),
    out: Path = _OUT,
    workers: int | None = _WORKERS,
    no_progress: bool = _NO_PROGRESS,
    no_group: bool = typer.Option(
        False, "--no-group", help="Train every run alone (default: the runs of one n and seed "
        "train together, with the same results)."),
    force: bool = _FORCE,
    keep_weights: bool = _KEEP_WEIGHTS,
    executor: Executor | None = None,
) -> None:
    """How many negatives can your data use? Fits m*(n), recommends m for your n and writes a
    report.

    Example: crl study negatives --preset quick --data pycode --out runs
    """
    from crl.experiments.api import run_and_report
    from crl.experiments.negatives.grid import parse_list

    outcome, analysis = run_and_report(
        "negatives", preset=preset, out=out, workers=workers, progress=not no_progress,
        data=data, model=model, metric=metric, tolerance=tolerance, temperature=temperature,
        config=config, loss=loss, ns=parse_list("--ns", ns, int),
        fractions=parse_list("--fractions", fractions, float),
        seeds=parse_list("--seeds", seeds, int), budget=budget, batch_size=batch_size,
        device=device, target_n=target_n, refine_runs=refine_runs,
        target_epochs=target_epochs, target_samples=target_samples, verify=verify,
        verify_seeds=verify_seeds,
        control=control, control_n=control_n, executor=executor,
        group_runs=not no_group, force=force, keep_weights=keep_weights)
    _finish(outcome.study_dir, analysis)


@study_app.command("compare")
@handle_errors
def compare(
    first: Path = typer.Argument(..., help="A negatives study directory."),
    second: Path = typer.Argument(..., help="Another, e.g. the full preset's."),
) -> None:
    """Do two negatives studies agree? Same question (data, metric, tolerance, target n,
    training), then per regime: each recommendation within the other's interval.

    Example: crl study compare runs/quick/negatives runs/full/negatives
    """
    from crl.experiments.negatives.compare import compare_studies

    comparison = compare_studies(first, second)
    for line in comparison.lines():
        print(line)
    print(comparison.verdict())


def _simple(name: str, doc: str) -> None:
    def command(preset: str = _PRESET, out: Path = _OUT, workers: int | None = _WORKERS,
                no_progress: bool = _NO_PROGRESS, force: bool = _FORCE,
                keep_weights: bool = _KEEP_WEIGHTS, executor: Executor | None = None) -> None:
        from crl.experiments.api import run_and_report

        outcome, analysis = run_and_report(name, preset=preset, out=out, workers=workers,
                                           progress=not no_progress, executor=executor,
                                           force=force, keep_weights=keep_weights)
        _finish(outcome.study_dir, analysis)

    command.__doc__ = doc
    study_app.command(name)(handle_errors(executor_options(command)))


_simple("calibration", "Excess AUC against excess risk along training, with the calibration "
        "bound; the hinge loss shown inconsistent.\n\nExample: crl study calibration")
_simple("imbalance", "Digits at imbalance ratios 1 to 100: supervised training against "
        "contrastive pre-training (with and without relaxed k-means).\n\n"
        "Example: crl study imbalance --preset quick")
_simple("gcl", "Small-batch GCL against mini-batch InfoNCE at B in {16, 64, 256, full}.\n\n"
        "Example: crl study gcl --preset quick")


@app.command("report")
@handle_errors
def report(study_dir: Path = typer.Argument(..., help="A study directory, e.g. runs/negatives."),
           from_results: bool = typer.Option(
               False, "--from-results",
               help="Read the rows from the study's results.csv (kept as it is) instead of its "
                    "run directories, e.g. for docs/results/negatives-full.")) -> None:
    """Rebuild a study's results.csv, plots and report.html from its files alone.

    Example: crl report runs/negatives
    """
    from crl.experiments.api import rebuild_report

    _finish(study_dir, rebuild_report(study_dir, from_results=from_results), headline=False)
