"""``crl mine DATA --model RUN|minilm|PATH --out FILE``: hard negatives mined with a model."""

from __future__ import annotations

from pathlib import Path

import typer

from crl.cli import app
from crl.cli._common import TRUST_FACTORY, handle_errors, trusted_factories


@app.command("mine")
@handle_errors
def mine(
    data: Path = typer.Argument(..., help="A table of pairs: .jsonl, .csv, .tsv, .parquet or a "
                                          "datasets save_to_disk directory."),
    model: str = typer.Option(..., "--model", help="minilm, a run directory of `crl train`, "
                                                   "or a sentence-transformers directory."),
    out: Path = typer.Option(..., "--out", help="The .jsonl, .csv, .tsv or .parquet to write."),
    a: str = typer.Option("a", "--a", help="The anchors' (queries') column."),
    b: str = typer.Option("b", "--b", help="The positives' (documents') column."),
    num_negatives: int = typer.Option(3, "--num-negatives", help="Negatives per anchor."),
    range_min: int = typer.Option(0, "--range-min", help="Best candidates skipped."),
    range_max: int | None = typer.Option(None, "--range-max", help="Candidates considered."),
    margin: float | None = typer.Option(
        None, "--margin", help="Drop candidates scoring above the positive minus this."),
    relative_margin: float | None = typer.Option(
        None, "--relative-margin",
        help="Drop candidates scoring above p - |p| * this (p: the positive's score)."),
    max_score: float | None = typer.Option(None, "--max-score", help="Highest negative score."),
    min_score: float | None = typer.Option(None, "--min-score", help="Lowest negative score."),
    prefix: str = typer.Option("negative", "--prefix", help="The new columns' prefix."),
    backend: str = typer.Option("auto", "--backend", help="auto (faiss when installed), "
                                                          "torch or faiss."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Texts per forward pass."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    trust_factory: str | None = TRUST_FACTORY,
) -> None:
    """Mine each anchor's hard negatives with MODEL and write DATA's rows with columns
    negative_1 ... negative_N (rows without enough negatives are left out).

    Example: crl mine pairs.jsonl --model minilm --out mined.jsonl --relative-margin 0.05
    """
    from crl.data.config import ColumnsConfig
    from crl.eval.encoder import load_encoder
    from crl.mine import MiningOptions, mine_file

    options = MiningOptions(num_negatives, range_min, range_max, margin, relative_margin,
                            max_score, min_score)
    encoder = load_encoder(model, device=device, batch_size=batch_size,
                           trusted_factories=trusted_factories(trust_factory))
    report = mine_file(data, encoder, out, columns=ColumnsConfig(a=a, b=b), options=options,
                       prefix=prefix, backend=backend, device=device,  # type: ignore[arg-type]
                       batch_size=batch_size)
    skipped = ", ".join(f"{n} {k}" for k, n in report.mined.skipped.items()) or "none"
    print(f"wrote {report.out}: {report.rows_out} of {report.rows_in} rows with "
          f"{num_negatives} negatives each (candidates dropped: {skipped}); train on it with "
          f"data.files.columns.negatives: [{', '.join(report.columns)}]")
