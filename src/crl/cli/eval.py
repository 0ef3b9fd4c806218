"""``crl eval``: score a run, the bundled MiniLM or a model directory, on a run's own test
split, on a file of pairs, or on queries, a corpus and qrels (docs/evaluation.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from crl.cli import app
from crl.cli._common import TRUST_FACTORY, handle_errors, trusted_factories


def parse_ks(text: str | None) -> list[int] | None:
    """``"1,5,10"`` as ``[1, 5, 10]``; None stays None.

    Raises:
        CrlValueError: unless every item is an integer >= 1.

    Example:
        >>> parse_ks("1, 10")
        [1, 10]
    """
    from crl.errors import CrlValueError

    if text is None:
        return None
    try:
        ks = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise CrlValueError(f"eval: --ks must be comma-separated integers >= 1 (e.g. 1,10,100); "
                            f"got {text!r}")
    return ks


def _write(out: Path, record: dict[str, Any]) -> None:
    from crl.rundir import OutputDir

    if out.is_dir():
        raise typer.BadParameter(f"--out {out} is a directory; give the .json file to write")
    OutputDir(out.parent).write_json(out.name, record)


def _print(title: str, metrics: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in sorted(metrics.items()):
        table.add_row(key, f"{value:g}" if "num_" in key else f"{value:.4f}")
    Console().print(table)


@app.command("eval")
@handle_errors
def evaluate(
    ctx: typer.Context,
    run_dir: Path | None = typer.Argument(None, help="A run directory written by `crl train` "
                                                     "(or give --model)."),
    model: str | None = typer.Option(None, "--model", help="minilm (the bundled "
                                     "all-MiniLM-L6-v2, zero-shot), a model directory or a run."),
    data: Path | None = typer.Option(None, "--data", help="A file of pairs to score (all its "
                                     "rows, or --split with --split-column)."),
    beir: Path | None = typer.Option(None, "--beir", help="A BEIR directory: corpus.jsonl, "
                                     "queries.jsonl, qrels/<split>.tsv."),
    qrels: Path | None = typer.Option(None, "--qrels", help="The qrels file of --beir (default "
                                      "qrels/<split>.tsv): BEIR TSV or TREC."),
    split: str | None = typer.Option(None, "--split", help="A run: test or val (default test); "
                                     "--beir: the qrels split (test); --data: all (default), "
                                     "or train/val/test with --split-column."),
    split_column: str | None = typer.Option(None, "--split-column",
                                            help="--data: the column naming each row's split."),
    ks: str | None = typer.Option(None, "--ks", help="Cut-offs, e.g. 1,10,100 (default: "
                                  "1,5,10 for pairs, 1,5,10,100 for qrels)."),
    a_column: str | None = typer.Option(None, "--a-column", help="--data: the column of the "
                                        "queries (default: the run's, else a)."),
    b_column: str | None = typer.Option(None, "--b-column", help="--data: the column of the "
                                        "documents (default: the run's, else b)."),
    id_column: str | None = typer.Option(None, "--id-column",
                                         help="--data: the column of document ids."),
    relevant_column: str | None = typer.Option(
        None, "--relevant-column", help="--data: a column listing more relevant document ids."),
    out: Path | None = typer.Option(None, "--out", help="The metrics .json to write (a run "
                                    "scored on its own split: RUN_DIR/eval.json as well)."),
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="Texts per forward pass."),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: the run's, "
                                      "else cpu)."),
    trust_factory: str | None = TRUST_FACTORY,
) -> None:
    """Score a model: a run on its own test split (RUN_DIR/eval.json), or any model (--model
    minilm|PATH|RUN) on a file of pairs (--data) or on queries, corpus and qrels (--beir).

    Examples: crl eval runs/pairs-1a2b3c4d;
    crl eval --model minilm --data pairs.jsonl --out minilm.json;
    crl eval runs/pairs-1a2b3c4d --beir scifact --ks 10,100 --out scifact.json
    """
    from crl.errors import CrlValueError

    if run_dir is None and model is None:
        from typer._click.exceptions import MissingParameter

        raise MissingParameter("Or give --model minilm|PATH|RUN.", ctx=ctx,
                               param_hint="'RUN_DIR'", param_type="argument")
    if run_dir is not None and model is not None:
        raise CrlValueError("eval: give a run directory or --model minilm|PATH|RUN, not both")
    if data is not None and beir is not None:
        raise CrlValueError("eval: give --data FILE or --beir DIR, not both")
    if qrels is not None and beir is None:
        raise CrlValueError("eval: --qrels needs --beir DIR (the queries and corpus it judges)")
    cut_offs = parse_ks(ks)
    trusted = trusted_factories(trust_factory)
    source = str(run_dir if run_dir is not None else model)
    if data is None and beir is None:
        metrics = _own_split(source, split or "test", device, trusted)
        record: dict[str, Any] = {"model": source, "split": split or "test", "metrics": metrics}
    else:
        from crl.eval.tasks import evaluate_model

        record = evaluate_model(
            source, data=data, beir=beir, qrels=qrels, split=split, split_column=split_column,
            ks=cut_offs, a_column=a_column, b_column=b_column, id_column=id_column,
            relevant_column=relevant_column, device=device or "cpu", batch_size=batch_size,
            trusted_factories=trusted, progress=True)
        metrics = record["metrics"]
    _print(f"{record['split']} metrics of {source}", metrics)
    if out is not None:
        _write(out, record)
        print(f"wrote {out}")
    elif data is not None or beir is not None:
        print("(pass --out FILE.json to keep these metrics)")


def _own_split(source: str, split: str, device: str | None, trusted: Any) -> dict[str, float]:
    """A run scored on its own test or val split (written to RUN_DIR/eval.json)."""
    from crl.errors import CrlValueError
    from crl.eval.encoder import MINILM
    from crl.rundir import EVAL_FILE
    from crl.train import evaluate_run

    if source == MINILM:
        raise CrlValueError("eval: --model minilm has no split of its own; give the data to "
                            "score: --data FILE or --beir DIR")
    metrics = evaluate_run(source, split=split, device=device, trusted_factories=trusted)
    print(f"wrote {Path(source) / EVAL_FILE}")
    return metrics
