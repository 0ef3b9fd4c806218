"""The batch study's data check (once, before any worker) and its set-up section."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crl.errors import CrlValueError
from crl.experiments.batch.grid import BatchGrid
from crl.experiments.study import Section, Table

if TYPE_CHECKING:
    from crl.experiments.batch.study import BatchStudy


def check_batches(config: dict[str, Any], grid: BatchGrid, metric: str) -> dict[str, Any]:
    """Load the data of a run ``config`` once (its model must take it) and check that the
    training pairs used hold the largest B; returns the data's sizes (``num_train``: the pairs
    used, the largest possible batch).

    Raises:
        CrlValueError: naming ``--batches`` or ``--num-train``, the sizes and the fix.
    """
    from crl.experiments.negatives.setup import check_data

    try:
        facts = check_data(config, [], metric)
    except CrlValueError as exc:
        raise CrlValueError(str(exc).replace("study negatives", "study batch")) from None
    train = int(facts["train_size"])
    if grid.num_train is not None and grid.num_train > train:
        raise CrlValueError(f"study batch: `--num-train` {grid.num_train:,} exceeds the "
                            f"{train:,} training pairs of {facts['data']!r}; choose at most "
                            f"{train}")
    n = train if grid.num_train is None else grid.num_train
    too_big = [b for b in grid.batches if b > n]
    if too_big:
        raise CrlValueError(f"study batch: `--batches` {too_big} exceed the {n:,} training "
                            f"pairs used (a batch is at most the training split); choose "
                            f"batch sizes of at most {n}")
    return {**facts, "num_train": n}


def setup_section(study: BatchStudy, data: dict[str, Any], distinct: int) -> Section:
    """The set-up: data, model, loss, optimiser, budget and the grid, in sentences and a
    table."""
    g = study.grid
    first = study.runs()[0].config
    source = ("the user's config " + str(study.options["config"]) if study.base is not None
              else "the study's own pycode set-up (the negatives study's bag-of-tokens model)")
    n = data.get("num_train") or g.num_train
    loss, optim = first["loss"], first["optim"]
    sizes = (f" {n:,} training pairs are used; every run is evaluated on the same "
             f"{data['test_size']:,} held-out test pairs." if n and data.get("test_size")
             else "")
    caching = ("every B trains in one pass" if g.micro_batch_size is None else
               f"every B above {g.micro_batch_size} trains with gradient caching in micro-batches "
               f"of {g.micro_batch_size} (train.micro_batch_size: the loss and gradients of the "
               "whole batch, the activation memory of the micro-batch)")
    paragraphs = [
        f"Sweep of {source}: data set {data.get('data', first['data']['name'])!r}, model "
        f"{data.get('model_kind', first['model'].get('kind'))!r}." + sizes,
        f"Every run trains with the in-batch loss {loss['name']!r} (temperature "
        f"{loss.get('temperature')}) and the {optim['name']} optimiser (learning rate "
        f"{optim['lr']:g}, the same at every B) for a fixed budget of {g.budget:,} training "
        f"pairs, so a run at batch size B takes ceil(budget / B) steps; {caching}. Seeds "
        f"{', '.join(map(str, g.seeds))} are paired: one seed draws the same data subset and "
        "initialisation at every B, so differences between B are measured within seed.",
        f"Distinct runs trained: {distinct} (the refinement's included).",
    ]
    batches = sorted({int(b) for b in g.batches} | {int(a["batch_size"]) for a in study.added})
    rows = [[b, b - 1, g.steps(b), g.steps(b) / max(1, int(n) // b) if n else "—",
             "one pass" if g.micro_batch(b) is None else g.micro_batch(b)] for b in batches]
    table = Table("The grid: batch sizes, their in-batch negatives, steps and epochs under the "
                  "budget, gradient caching",
                  ["B", "m = B - 1", "steps", "epochs", "micro-batch"], rows)
    return Section("Set-up", paragraphs, tables=[table])
