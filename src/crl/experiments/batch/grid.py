"""The sweep of ``crl study batch``: preset grids of batch sizes, their overrides, and the run
config of one (B, seed), from the study's own pycode model or from the user's ``crl train``
config (docs/batch.md, "The design").

Every run sees the same number of training pairs (the sample budget), so a run at batch size
``B`` takes ``ceil(budget / B)`` steps. A batch larger than the micro-batch trains with
gradient caching (``train.micro_batch_size``, docs/training.md): the loss and its gradients are
those of the whole batch, the activation memory that of the micro-batch.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from crl.errors import CrlValueError

#: The losses whose negatives are the other pairs of the batch (``negatives.regime:
#: in_batch``): a batch of B gives each anchor m = B - 1 shared negatives (docs/theory.md §9).
IN_BATCH_LOSSES = ("clip", "info_nce", "dcl", "siglip")
WHERE = "study batch"


@dataclass(frozen=True)
class BatchGrid:
    """The sweep of one preset.

    Attributes:
        batches: The batch sizes B swept, ascending.
        seeds: Seeds; every B runs with each (paired: one seed, one data subset and one
            initialisation across B).
        budget: Training pairs seen by every run (``train.max_samples``).
        micro_batch_size: Gradient caching for every B above it (None: one pass for every B).
        num_train: Training pairs used (None: the whole training split).
        refine_runs: Run budget of the refinement stage.
    """

    batches: tuple[int, ...]
    seeds: tuple[int, ...]
    budget: int
    micro_batch_size: int | None
    num_train: int | None = None
    refine_runs: int = 0

    def steps(self, batch: int) -> int:
        """Optimiser steps of a run at batch size ``batch``: ``ceil(budget / B)``.

        Example:
            >>> BatchGrid((32,), (0,), 16_000, 256).steps(1024)
            16
        """
        return math.ceil(self.budget / batch)

    def micro_batch(self, batch: int) -> int | None:
        """The micro-batch of a run at ``batch`` (None: one pass, the batch fits).

        Example:
            >>> grid = BatchGrid((32,), (0,), 16_000, 256)
            >>> grid.micro_batch(256), grid.micro_batch(512)
            (None, 256)
        """
        if self.micro_batch_size is None or batch <= self.micro_batch_size:
            return None
        return self.micro_batch_size


#: Per preset, for the study's own pycode bag-of-tokens model (the negatives study's model).
GRIDS: dict[str, BatchGrid] = {
    "smoke": BatchGrid((8, 16, 32), (0, 1), 256, 16, num_train=256),
    "quick": BatchGrid((8, 16, 32, 64, 128, 256, 512, 1024), (0, 1, 2), 16_000, 256,
                       num_train=4000, refine_runs=9),
    "full": BatchGrid((8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096), (0, 1, 2, 3, 4),
                      200_000, 256, num_train=None, refine_runs=30),
}


def _integers(option: str, values: Sequence[int], low: int) -> tuple[int, ...]:
    if not values or any(isinstance(v, bool) or int(v) != v or v < low for v in values):
        raise CrlValueError(f"{WHERE}: `--{option}` must be integers >= {low}; got "
                            f"{list(values)}")
    return tuple(sorted({int(v) for v in values}))


def override_grid(grid: BatchGrid, *, batches: Sequence[int] | None = None,
                  seeds: Sequence[int] | None = None, budget: int | None = None,
                  micro_batch_size: int | None = None, num_train: int | None = None,
                  refine_runs: int | None = None) -> BatchGrid:
    """``grid`` with the given fields replaced, each checked.

    Raises:
        CrlValueError: naming the option, what it must be and what came.
    """
    changes: dict[str, Any] = {}
    if batches is not None:
        changes["batches"] = _integers("batches", batches, 2)
        if len(changes["batches"]) < 2:
            raise CrlValueError(f"{WHERE}: `--batches` needs at least 2 batch sizes; got "
                                f"{list(batches)}")
    if seeds is not None:
        changes["seeds"] = _integers("seeds", seeds, 0)
    for name, value, low in (("budget", budget, 1), ("micro_batch_size", micro_batch_size, 1),
                             ("num_train", num_train, 2), ("refine_runs", refine_runs, 0)):
        if value is not None:
            if isinstance(value, bool) or int(value) != value or value < low:
                raise CrlValueError(f"{WHERE}: `--{name.replace('_', '-')}` must be an integer "
                                    f">= {low}; got {value!r}")
            changes[name] = int(value)
    return replace(grid, **changes)


def default_run_config(grid: BatchGrid, *, batch: int, seed: int,
                       device: str | None) -> dict[str, Any]:
    """The run config of one (B, seed) with the study's own data, model and optimiser: the
    pycode pairs, the negatives study's bag of tokens (sparse table, lazy AdamW), the CLIP loss
    (in-batch negatives, a learnable logit scale) and a warm-up of 5% of the run's steps."""
    config: dict[str, Any] = {
        "data": {"name": "pycode", "num_train": grid.num_train, "seed": seed,
                 "val_fraction": 0.0},
        "model": {"kind": "embedding_bag", "embed_dim": 128, "token_dim": 64, "head": "linear",
                  "sparse": True},
        "loss": {"name": "clip", "temperature": 0.05},
        "optim": {"name": "adamw", "lr": 5e-3, "weight_decay": 1e-4,
                  "warmup_steps": max(1, grid.steps(batch) // 20)},
        "train": {"seed": seed, "batch_size": batch, "max_samples": grid.budget,
                  "micro_batch_size": grid.micro_batch(batch), "log_every": 25,
                  "checkpoint_every_s": 60.0},  # by time: kept only while the run trains
        "eval": {"probe": False, "geometry": False, "risk": False},
    }
    if device is not None:
        config["train"]["device"] = device
    return config


def check_in_batch(base: dict[str, Any], origin: str) -> None:
    """Refuse a resolved ``crl train`` config whose loss does not take in-batch negatives.

    Raises:
        CrlValueError: one line naming ``loss.name`` (or ``negatives.regime``), the in-batch
            losses and what came.
    """
    name = base["loss"]["name"]
    if name not in IN_BATCH_LOSSES:
        raise CrlValueError(
            f"{WHERE}: {origin}: loss.name must be an in-batch loss ("
            + ", ".join(IN_BATCH_LOSSES) + f") for a batch-size sweep; got {name!r}"
            + (" (GCL's negatives do not depend on B: use crl study negatives)"
               if name == "gcl" else ""))
    regime = base["negatives"]["regime"]
    if regime != "in_batch":
        raise CrlValueError(f"{WHERE}: {origin}: negatives.regime must be 'in_batch' for a "
                            f"batch-size sweep (m = B - 1); got {regime!r} (sweep m with crl "
                            "study negatives)")


def user_run_config(base: dict[str, Any], grid: BatchGrid, *, batch: int, seed: int,
                    device: str | None, probe: bool = False) -> dict[str, Any]:
    """The run config of one (B, seed) from a user's resolved ``crl train`` config ``base``:
    its data, model, loss and optimiser stay; the batch, the budget, the micro-batch, the
    seeds and (when given) the training pairs used are the study's; the probes run when the
    study's metric is one (``probe``)."""
    config = copy.deepcopy(base)
    config["data"]["seed"] = seed
    if grid.num_train is not None:
        config["data"]["num_train"] = grid.num_train
    config["train"].update(seed=seed, batch_size=batch, epochs=None, steps=None,
                           max_samples=grid.budget, eval_every=None, checkpoint_every=None,
                           checkpoint_every_s=60.0, micro_batch_size=grid.micro_batch(batch))
    if device is not None:
        config["train"]["device"] = device
    config["eval"]["probe"] = bool(config["eval"]["probe"] or probe)
    return config
