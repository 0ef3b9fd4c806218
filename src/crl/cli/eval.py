"""``crl eval RUN_DIR``: re-evaluate a trained run from its checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from crl.cli import app
from crl.cli._common import TRUST_FACTORY, handle_errors, trusted_factories


@app.command("eval")
@handle_errors
def evaluate(
    run_dir: Path = typer.Argument(..., help="A run directory written by `crl train`."),
    split: str = typer.Option("test", "--split", help="test or val."),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: the run's)."),
    trust_factory: str | None = TRUST_FACTORY,
) -> None:
    """Load a run's config and checkpoint, evaluate on the test split, print a table and write
    RUN_DIR/eval.json.

    Example: crl eval runs/digits-simclr-1a2b3c4d
    """
    from rich.console import Console
    from rich.table import Table

    from crl.train import evaluate_run

    metrics = evaluate_run(run_dir, split=split, device=device,
                           trusted_factories=trusted_factories(trust_factory))
    table = Table(title=f"{split} metrics of {run_dir}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in sorted(metrics.items()):
        table.add_row(key, f"{value:.4f}")
    Console().print(table)
    print(f"wrote {run_dir / 'eval.json'}")
