"""``crl train CONFIG``: train one run from a YAML file or a shipped preset."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import typer

from crl.cli import app
from crl.cli._common import handle_errors


def _print_summary(summary: dict[str, object], run_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"run {run_dir}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in sorted(summary.items()):
        if isinstance(value, float):
            table.add_row(key, f"{value:.4f}")
        elif value is not None:
            table.add_row(key, str(value))
    Console().print(table)


def without_nproc(argv: Sequence[str]) -> list[str]:
    """The command line after the program name, less ``--nproc N`` / ``--nproc=N``: what each
    torchrun process runs, so every other option is forwarded unchanged.

    Example:
        >>> without_nproc(["crl", "train", "x.yaml", "--nproc", "2", "--set", "a=1"])
        ['train', 'x.yaml', '--set', 'a=1']
    """
    out: list[str] = []
    args = iter(argv[1:])
    for arg in args:
        if arg == "--nproc":
            next(args, None)
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def _writer_lock(run_dir: Path) -> AbstractContextManager[None]:
    """The run directory's write lock, taken before ``fit`` looks into the directory: a second
    ``crl train`` into it fails at once, naming this process (rank 0 only: the other ranks of a
    torchrun job write nothing, and their process group is not joined yet, hence ``RANK``)."""
    from crl.rundir import lock_directory

    if os.environ.get("RANK", "0") != "0":
        return nullcontext()
    return lock_directory(run_dir, blocking=False)


@app.command("train")
@handle_errors
def train(
    config: str = typer.Argument(..., help="A YAML config file or a preset name "
                                           "(digits-simclr, pycode-clip, synthetic-gaussian)."),
    overrides: list[str] = typer.Option(
        [], "--set", help="Override a config key, e.g. --set train.steps=100 (repeatable)."),
    smoke: bool = typer.Option(False, "--smoke", help="Shrink the run to seconds (a check)."),
    out: Path = typer.Option(Path("runs"), "--out", help="Parent of the run directory."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint."),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: config)."),
    micro_batch_size: int | None = typer.Option(
        None, "--micro-batch-size", min=1,
        help="Gradient caching (train.micro_batch_size): embed each batch in micro-batches of "
             "this size, then back-propagate the full batch's loss through them; the same loss "
             "and gradients, activation memory of this many pairs, about one extra forward pass "
             "of time (docs/training.md)."),
    micro_batch_tokens: int | None = typer.Option(
        None, "--micro-batch-tokens", min=1,
        help="Gradient caching with micro-batches packed by tokens (train.micro_batch_tokens): "
             "each view's texts sorted by length and cut into micro-batches of at most this "
             "many padded tokens; the same gradients as --micro-batch-size, less padding "
             "(docs/training.md). Needs a transformer tower."),
    precision: str | None = typer.Option(
        None, "--precision",
        help="fp32 or bf16 (train.precision): bf16 runs the towers under bfloat16 autocast; the "
             "loss and the logit scale stay float32 (docs/training.md)."),
    tensorboard: bool = typer.Option(False, "--tensorboard",
                                     help="Also write TensorBoard event files."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    nproc: int = typer.Option(1, "--nproc", min=1,
                              help="Processes on this machine (torchrun; docs/distributed.md)."),
) -> None:
    """Train a dual encoder and write OUT/<name>-<config hash>/ (config, metrics, checkpoint,
    summary).

    Large batches at bounded memory (docs/training.md): --micro-batch-size K or
    --micro-batch-tokens N (gradient caching), --precision bf16, and for transformer towers
    --set model.gradient_checkpointing=true; an example config is in docs/training.md ("Large
    batches at bounded memory").

    Examples: crl train digits-simclr --set train.steps=500 --out runs;
    crl train pycode-clip --set train.batch_size=1024 --micro-batch-size 32 --precision bf16
    """
    from crl import distributed
    from crl.train import config_hash, fit, load_config, smoke_config

    if nproc > 1:  # the same command line under torchrun, less --nproc
        raise typer.Exit(distributed.launch(nproc, without_nproc(sys.argv)))
    options = {"train.device": device, "train.micro_batch_size": micro_batch_size,
               "train.micro_batch_tokens": micro_batch_tokens, "train.precision": precision}
    overrides = [*overrides, *(f"{k}={v}" for k, v in options.items() if v is not None)]
    cfg = load_config(config, overrides)
    if smoke:
        cfg = smoke_config(cfg)
    name = Path(config).stem if Path(config).is_file() else config
    run_dir = out / f"{name}-{config_hash(cfg)}"
    try:  # fit joins the process group under torchrun
        with _writer_lock(run_dir):
            result = fit(cfg, run_dir, resume=resume, progress=progress,
                         tensorboard=tensorboard)
    except BaseException:
        distributed.shutdown(wait=False)
        raise
    if distributed.is_main():
        _print_summary(result.summary, run_dir)
        print(f"run directory: {run_dir}")
    under_torchrun = distributed.is_active()
    distributed.shutdown()
    if under_torchrun:
        distributed.finish(0)  # no interpreter teardown after the process group (see there)
