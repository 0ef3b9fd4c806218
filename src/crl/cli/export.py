"""``crl export RUN_DIR OUT --format sentence-transformers``: a run's model for use elsewhere."""

from __future__ import annotations

from pathlib import Path

import typer

from crl.cli import app
from crl.cli._common import TRUST_FACTORY, handle_errors, trusted_factories


@app.command("export")
@handle_errors
def export(
    run_dir: Path = typer.Argument(..., help="A run directory written by `crl train`."),
    out: Path = typer.Argument(..., help="The directory to write (new or empty)."),
    format: str = typer.Option("sentence-transformers", "--format",
                               help="Export format: sentence-transformers."),
    tower: str = typer.Option("both", "--tower",
                              help="both (a two-tower model as one model: encode_query is "
                                   "tower a, encode_document tower b), a or b."),
    trust_factory: str | None = TRUST_FACTORY,
) -> None:
    """Write a fine-tuned `transformer` run as a directory SentenceTransformer(OUT) loads
    offline (weights as safetensors), with the run's own embeddings.

    Example: crl export runs/pairs-1a2b3c4d my-model --format sentence-transformers
    """
    from crl.train.trained import export_run

    path = export_run(run_dir, out, format=format, tower=tower,  # type: ignore[arg-type]
                      trusted_factories=trusted_factories(trust_factory))
    print(f"wrote {path} (load it with SentenceTransformer({str(path)!r}))")
