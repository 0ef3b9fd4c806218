"""``crl train CONFIG``: train one run from a YAML file or a shipped preset."""

from __future__ import annotations

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
    tensorboard: bool = typer.Option(False, "--tensorboard",
                                     help="Also write TensorBoard event files."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    nproc: int = typer.Option(1, "--nproc", min=1,
                              help="Processes on this machine (torchrun; docs/distributed.md)."),
) -> None:
    """Train a dual encoder and write OUT/<name>-<config hash>/ (config, metrics, checkpoint,
    summary).

    Example: crl train digits-simclr --set train.steps=500 --out runs
    """
    from crl import distributed
    from crl.train import config_hash, fit, load_config, smoke_config

    if nproc > 1:  # the same command under torchrun, without --nproc
        args = ["train", config, *[a for o in overrides for a in ("--set", o)],
                "--out", str(out), *(["--smoke"] if smoke else []),
                *(["--resume"] if resume else []), *(["--device", device] if device else []),
                *(["--tensorboard"] if tensorboard else []), "--progress" if progress
                else "--no-progress"]
        raise typer.Exit(distributed.launch(nproc, args))
    if device is not None:
        overrides = [*overrides, f"train.device={device}"]
    cfg = load_config(config, overrides)
    if smoke:
        cfg = smoke_config(cfg)
    name = Path(config).stem if Path(config).is_file() else config
    run_dir = out / f"{name}-{config_hash(cfg)}"
    under_torchrun = distributed.init_from_env(cfg.train.device)
    try:
        result = fit(cfg, run_dir, resume=resume, progress=progress, tensorboard=tensorboard)
    except BaseException:
        distributed.shutdown(wait=False)
        raise
    if distributed.is_main():
        _print_summary(result.summary, run_dir)
        print(f"run directory: {run_dir}")
    distributed.shutdown()
    if under_torchrun:
        distributed.finish(0)  # no interpreter teardown after the process group (see there)
