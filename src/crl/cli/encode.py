"""``crl encode RUN_DIR FILE --out EMB.npy``: embed a file's texts with a trained run."""

from __future__ import annotations

from pathlib import Path

import typer

from crl.cli import app
from crl.cli._common import TRUST_FACTORY, handle_errors, trusted_factories


@app.command("encode")
@handle_errors
def encode(
    run_dir: Path = typer.Argument(..., help="A run directory written by `crl train`."),
    file: Path = typer.Argument(..., help="A table of texts: .jsonl, .csv, .tsv, .parquet or "
                                          "a datasets save_to_disk directory."),
    out: Path = typer.Option(..., "--out", help="The .npy file to write, float32 (N, D)."),
    view: str = typer.Option("a", "--view", help="a (queries) or b (documents)."),
    column: str | None = typer.Option(
        None, "--column", help="The column to embed (default: the run's column of the view)."),
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="Texts per forward pass."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    trust_factory: str | None = TRUST_FACTORY,
) -> None:
    """Embed the texts of one column of FILE (the run's column mapping) and save them as a
    NumPy array, row i for the i-th text.

    Example: crl encode runs/pairs-1a2b3c4d queries.csv --out queries.npy
    """
    from crl.train.trained import encode_file

    emb = encode_file(run_dir, file, out, view=view, column=column,  # type: ignore[arg-type]
                      batch_size=batch_size, device=device, progress=progress,
                      trusted_factories=trusted_factories(trust_factory))
    print(f"wrote {out}: {emb.shape[0]} embeddings of dimension {emb.shape[1]}")
