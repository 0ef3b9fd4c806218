"""The sweep of ``crl study negatives``: preset grids, their overrides, and the run config of
one grid point, from the study's own defaults or from the user's ``crl train`` config."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from crl.data.files import SUPPORTED_SUFFIXES
from crl.errors import CrlValueError

FRACTIONS_FULL = (0.01, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0)
DATA_NAMES = ("pycode", "digits", "synthetic")


@dataclass(frozen=True)
class Grid:
    """The sweep of one preset: anchors ``ns``, fractions ``m/n``, seeds, the training of a run
    (``budget`` processed samples, or ``target_epochs`` passes over its n), batch size and
    refinement runs.

    Attributes:
        target_epochs: When set, every n trains this many epochs (``--target-epochs``) and
            ``budget`` is unused; else every run processes ``budget`` samples
            (``--target-samples``, the preset's default).
    """

    ns: tuple[int, ...]
    fractions: tuple[float, ...]
    seeds: tuple[int, ...]
    budget: int
    batch_size: int
    refine_runs: int = 0
    target_epochs: float | None = None

    def batch(self, n: int, batch_size: int | None = None) -> int:
        """The batch of a run over ``n`` anchors: ``batch_size`` (the grid's by default), at
        most ``n``."""
        return min(self.batch_size if batch_size is None else batch_size, n)

    def steps(self, n: int, batch_size: int | None = None) -> int:
        """Steps of a run over ``n`` anchors: ``ceil(budget / B)`` with the batch ``B`` at most
        ``n`` (``train.max_samples``, docs/training.md), or ``ceil(E floor(n / B))`` for
        ``target_epochs = E``."""
        b = self.batch(n, batch_size)
        if self.target_epochs is not None:
            return max(1, math.ceil(self.target_epochs * (n // b) - 1e-9))
        return math.ceil(self.budget / b)

    def samples(self, n: int, batch_size: int | None = None) -> int:
        """The ``train.max_samples`` of a run over ``n`` anchors: the budget, or the steps of
        ``target_epochs`` times the batch."""
        if self.target_epochs is None:
            return self.budget
        return self.steps(n, batch_size) * self.batch(n, batch_size)

    def epochs(self, n: int, batch_size: int | None = None) -> float:
        """Epochs over ``n`` anchors as the runs count them (their ``epoch`` column): steps over
        the full batches of one pass, ``floor(n / B)`` (the last partial batch is dropped).

        Example:
            >>> round(Grid((250,), (1.0,), (0,), 12_000, 128).epochs(250), 2)  # 94 steps, 1 a pass
            94.0
        """
        b = self.batch(n, batch_size)
        return self.steps(n, batch_size) / (n // b)

    def negatives_per_step(self, n: int, m: float, batch_size: int | None = None) -> float:
        """``k = B m / n``: how many of an anchor's m negatives are in one batch of ``B``
        (GCL's moving estimate is refreshed on these; docs/negatives.md)."""
        return self.batch(n, batch_size) * m / n

    def training_text(self) -> str:
        """The training of a run in words (``12,000 samples per run``, ``5 epochs at every
        n``)."""
        if self.target_epochs is not None:
            unit = "epoch" if self.target_epochs == 1 else "epochs"
            return f"{self.target_epochs:g} {unit} at every n"
        return f"{self.budget:,} samples per run"


# Per data set and preset. Budgets are processed samples per run, equal for every n (the paper's
# design), so smaller n means more epochs over the same anchors.
GRIDS: dict[str, dict[str, Grid]] = {
    "pycode": {
        "smoke": Grid((64, 128, 512), (0.05, 0.25, 1.0), (0,), 1024, 64),
        "quick": Grid((250, 500, 1000, 2000), (0.01, 0.05, 0.1, 0.4, 1.0), (0, 1, 2, 3),
                      12_000, 128, refine_runs=96),
        "full": Grid((1000, 2500, 6000, 15000), FRACTIONS_FULL, (0, 1, 2), 200_000, 256,
                     refine_runs=200),
    },
    "digits": {
        "smoke": Grid((64, 128, 512), (0.05, 0.25, 1.0), (0,), 1024, 64),
        "quick": Grid((150, 400, 1200), FRACTIONS_FULL, (0, 1), 20_000, 128),
        "full": Grid((150, 400, 1200), FRACTIONS_FULL, (0, 1, 2), 100_000, 256,
                     refine_runs=100),
    },
    "synthetic": {
        "smoke": Grid((64, 128, 512), (0.05, 0.25, 1.0), (0,), 1024, 64),
        "quick": Grid((256, 768, 2048), FRACTIONS_FULL, (0, 1), 16_000, 128),
        "full": Grid((512, 2048, 8192, 32768), FRACTIONS_FULL, (0, 1, 2), 200_000, 256,
                     refine_runs=200),
    },
}
# A user's file gets the rigour of the pycode presets (their n span, fractions, seeds, budget and
# refinement); a file too small for the span gets it scaled (negatives.userdata.fit_span).
GRIDS["files"] = {"smoke": GRIDS["synthetic"]["smoke"], "quick": GRIDS["pycode"]["quick"],
                  "full": GRIDS["pycode"]["full"]}
#: The data kinds of :data:`GRIDS`, in words.
DATA_WORDS = {"pycode": "pycode", "files": "a user's file", "digits": "digits",
              "synthetic": "synthetic"}


def distinct_runs(grid: Grid) -> int:
    """The grid's distinct runs before refinement: every (n, m, regime, seed), with one run for
    both regimes where ``m >= n - 1``.

    Example:
        >>> distinct_runs(Grid((10,), (0.5, 1.0), (0, 1), 100, 4))  # m = 5 twice, m = 10 once
        6
    """
    per_seed = 0
    for n in grid.ns:
        ms = {max(1, round(f * n)) for f in grid.fractions}
        per_seed += sum(1 if m >= n - 1 else 2 for m in ms)
    return per_seed * len(grid.seeds)


def grid_table() -> str:
    """Each preset's grid per data kind as a Markdown table (README.md, "The main job", holds
    exactly this; tests/test_readme_grids.py checks it)."""
    lines = ["| data | preset | n | m/n (%) | seeds | samples per run | batch | grid runs "
             "| refinement runs (at most) |", "| --- | --- | --- | --- | --- | --- | --- | --- "
             "| --- |"]
    rows = [(words, preset, g) for kind, words in DATA_WORDS.items()
            for preset, g in GRIDS[kind].items()]
    rows += [("a pretrained transformer (any data)", preset, g)
             for preset, g in TRANSFORMER_GRIDS.items()]
    for words, preset, g in rows:
        lines.append(f"| {words} | {preset} | {', '.join(f'{n:,}' for n in g.ns)} | "
                     f"{', '.join(f'{100 * f:g}' for f in g.fractions)} | {len(g.seeds)} | "
                     f"{g.budget:,} | {g.batch_size} | {distinct_runs(g)} | "
                     f"{g.refine_runs} |")
    return "\n".join(lines) + "\n"

# The quick preset for a pretrained transformer (``model.kind: transformer``), whatever the data:
# one run of 512 samples costs about 55 CPU-s with the top 2 of MiniLM's 6 layers trained and
# the bottom cached, 135 CPU-s fine-tuned in full (benchmarks/README.md, section
# "benchmarks/frozen.py"), so the data set's quick grid (12,000 samples per run, 144 runs and
# 96 refinement runs) would take days on 2 cores. This one (42 runs) took 1,881 CPU-s there.
TRANSFORMER_GRIDS: dict[str, Grid] = {
    "quick": Grid((256, 768, 2048), (0.01, 0.05, 0.2, 1.0), (0, 1), 512, 32),
}


def preset_grid(kind: str, preset: str, model_kind: str | None) -> tuple[Grid, str | None]:
    """The grid of ``preset`` on data of ``kind`` for a model of ``model_kind``, and why it is
    not the data set's (None when it is): the quick preset of a pretrained transformer is
    :data:`TRANSFORMER_GRIDS` (the rule docs/negatives.md states); other presets keep the data
    set's grid.

    Example:
        >>> preset_grid("files", "quick", "transformer")[0].budget
        512
        >>> preset_grid("files", "quick", "auto")[1] is None
        True
    """
    data_grid = GRIDS[kind][preset]
    if model_kind != "transformer" or preset not in TRANSFORMER_GRIDS:
        return data_grid, None
    grid = TRANSFORMER_GRIDS[preset]
    reason = (f"The {preset} preset's grid for a pretrained transformer differs from the "
              f"one for {kind} data ({data_grid.training_text()}, "
              f"{len(data_grid.fractions)} fractions, {len(data_grid.seeds)} seeds): a run of "
              "all-MiniLM-L6-v2 costs about 55 CPU-s per 512 samples with its top 2 layers "
              f"trained (benchmarks/frozen.py), so it trains {grid.training_text()} at batch "
              f"{grid.batch_size} over {len(grid.fractions)} fractions and {len(grid.seeds)} "
              "seeds, without refinement: a budget of 30 minutes on 2 CPU cores (measured: "
              "1,881 CPU-s for the 42 runs, docs/negatives.md).")
    return grid, reason


def override_grid(grid: Grid, *, ns: Sequence[int] | None = None,
                  fractions: Sequence[float] | None = None, seeds: Sequence[int] | None = None,
                  budget: int | None = None, batch_size: int | None = None,
                  refine_runs: int | None = None, target_epochs: float | None = None
                  ) -> Grid:
    """``grid`` with the given fields replaced, each checked (``target_epochs`` replaces the
    samples budget)."""
    where = "study negatives"
    changes: dict[str, Any] = {}
    if ns is not None:
        if not ns or any(isinstance(n, bool) or int(n) != n or n < 2 for n in ns):
            raise CrlValueError(f"{where}: `--ns` must be integers >= 2; got {list(ns)}")
        changes["ns"] = tuple(sorted({int(n) for n in ns}))
    if fractions is not None:
        if not fractions or any(not 0 < float(f) <= 1 for f in fractions):
            raise CrlValueError(f"{where}: `--fractions` (m/n) must lie in (0, 1]; got "
                                f"{list(fractions)}")
        changes["fractions"] = tuple(sorted({float(f) for f in fractions}))
    if seeds is not None:
        if not seeds or any(int(s) != s or s < 0 for s in seeds):
            raise CrlValueError(f"{where}: `--seeds` must be integers >= 0; got {list(seeds)}")
        changes["seeds"] = tuple(sorted({int(s) for s in seeds}))
    for name, value, low in (("budget", budget, 1), ("batch_size", batch_size, 2),
                             ("refine_runs", refine_runs, 0)):
        if value is not None:
            if isinstance(value, bool) or int(value) != value or value < low:
                raise CrlValueError(f"{where}: `--{name.replace('_', '-')}` must be an integer "
                                    f">= {low}; got {value!r}")
            changes[name] = int(value)
    if target_epochs is not None:
        if isinstance(target_epochs, bool) or not math.isfinite(target_epochs) \
                or target_epochs <= 0:
            raise CrlValueError(f"{where}: `--target-epochs` must be a number > 0; got "
                                f"{target_epochs!r}")
        if budget is not None:
            raise CrlValueError(f"{where}: give `--target-epochs` or `--target-samples` "
                                f"(`--budget`), not both; got {target_epochs:g} epochs and "
                                f"{budget:,} samples")
        changes["target_epochs"] = float(target_epochs)
    return replace(grid, **changes)


#: The study option that sets each field of a :class:`Grid`.
GRID_FLAGS = {"ns": "--ns", "fractions": "--fractions", "seeds": "--seeds",
              "budget": "--budget (--target-samples)", "batch_size": "--batch-size",
              "refine_runs": "--refine-runs", "target_epochs": "--target-epochs"}


def grid_changes(preset: Grid, grid: Grid) -> list[str]:
    """The fields of ``grid`` that differ from the ``preset`` grid it was made from (a custom
    grid when any do).

    Example:
        >>> quick = GRIDS["pycode"]["quick"]
        >>> grid_changes(quick, override_grid(quick, seeds=[0, 1, 2, 3], batch_size=64))
        ['batch_size']
    """
    return [name for name in GRID_FLAGS if getattr(grid, name) != getattr(preset, name)]


def data_section(data: str) -> tuple[str, dict[str, Any]]:
    """The data set's kind and ``data`` config for ``--data NAME|FILE``."""
    if data in DATA_NAMES:
        section: dict[str, Any] = {"name": data}
        if data == "synthetic":
            # A 16-dim latent-class pool: enough structure for m to matter, fast to train.
            section["synthetic"] = {"model": "correlated_gaussian", "dim": 16, "rho": 0.6,
                                    "num_samples": 6000}
        return data, section
    path = Path(data)
    if not path.is_dir() and path.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise CrlValueError(
            f"study negatives: `--data` must be one of {', '.join(DATA_NAMES)}, a "
            f"{'/'.join(SUPPORTED_SUFFIXES)} file or a datasets save_to_disk directory; got "
            f"{data!r}"
        )
    if not path.exists():
        raise CrlValueError(f"study negatives: data file {data!r} does not exist")
    return "files", {"name": "files", "files": {"path": str(path.resolve())}}


def model_section(kind: str, model: str | None) -> dict[str, Any]:
    """The study's default model for a data set (``auto`` for a user's file: the model follows
    the data as in ``crl train``). The pycode bag of tokens trains its table with sparse
    gradients and lazy AdamW (docs/training.md, section "Sparse embedding gradients")."""
    if model is not None:
        return {"kind": model}
    if kind == "pycode":
        return {"kind": "embedding_bag", "embed_dim": 128, "token_dim": 64, "head": "linear",
                "sparse": True}
    if kind == "digits":
        return {"kind": "cnn", "embed_dim": 64, "hidden_dim": 128, "shared_tower": True}
    if kind == "files":
        return {"kind": "auto", "embed_dim": 32, "hidden_dim": 128}
    return {"kind": "mlp", "embed_dim": 32, "hidden_dim": 128}


def default_run_config(data: dict[str, Any], model: dict[str, Any], grid: Grid, *, n: int, m: int,
                       regime: str, seed: int, temperature: float, probe: bool,
                       device: str | None, risk: bool = False,
                       batch_size: int | None = None, loss: str = "gcl") -> dict[str, Any]:
    """The run config of one grid point with the study's own data, model, optimiser and loss
    (GCL unless ``loss``, which must take negative sets, :func:`study_loss`); the
    held-out risk (float64 tiles over the test set, half of a run's evaluation) only when it
    is the study's metric (``risk``). ``batch_size`` replaces the grid's (the control arm's
    second batch size)."""
    b = grid.batch(n, batch_size)
    # The preset's warm-up (samples mode, the grid's batch) is kept exactly as it was; other
    # trainings take a twentieth of their own steps.
    warmup = (grid.budget // grid.batch_size // 20
              if grid.target_epochs is None and batch_size is None else grid.steps(n, b) // 20)
    config: dict[str, Any] = {
        "data": {**data, "num_train": n, "seed": seed, "val_fraction": 0.0},
        "model": model,
        "loss": {"name": study_loss("gcl", loss), "temperature": temperature,
                 "gcl": {"gamma": 0.9, "gamma_schedule": "constant"}},
        "negatives": {"regime": regime, "m": m, "seed": seed},
        "optim": {"name": "adamw", "lr": 5e-3, "weight_decay": 1e-4,
                  "warmup_steps": max(1, warmup)},
        "train": {"seed": seed, "batch_size": b,
                  "max_samples": grid.samples(n, b), "log_every": 25,
                  "checkpoint_every_s": 60.0},  # by time: kept only while the run trains
        # probes and the risk only when the summary metric is one (they take time)
        "eval": {"probe": probe, "geometry": False, "risk": risk},
    }
    if device is not None:
        config["train"]["device"] = device
    return config


def set_losses() -> list[str]:
    """The losses that take a negative set (as their registered objectives declare): the ones
    a study of m can train."""
    from crl.losses.registry import OBJECTIVES

    return sorted(name for name, objective in OBJECTIVES.items()
                  if objective.accepts_negative_sets)


def study_loss(config_loss: str, loss: str | None) -> str:
    """The loss a ``--config`` study trains: ``--loss`` when given, else the config's own (its
    options stay either way); it must take a negative set, or m cannot be swept with it.

    Raises:
        CrlValueError: one line naming the loss and the losses that can.

    Example:
        >>> study_loss("clip", None), study_loss("siglip", "gcl")
        ('clip', 'gcl')
    """
    name = loss or config_loss
    if name not in set_losses():
        origin = f"`--loss` {loss!r}" if loss else f"the config's loss {config_loss!r}"
        raise CrlValueError(f"study negatives: {origin} takes no negative set (in-batch only), "
                            f"so m cannot be swept with it; losses that can: "
                            f"{', '.join(set_losses())} (choose one with --loss)")
    return name


def user_run_config(base: dict[str, Any], grid: Grid, *, n: int, m: int, regime: str,
                    seed: int, temperature: float | None, probe: bool,
                    device: str | None, batch_size: int | None = None,
                    loss: str | None = None) -> dict[str, Any]:
    """The run config of one grid point from a user's resolved ``crl train`` config ``base``:
    its data, model, loss and its options, and optimiser stay (``loss`` replaces the loss's
    name, :func:`study_loss`); n, m, the seeds, the budget and the batch are the study's."""
    config = copy.deepcopy(base)
    config["data"].update(num_train=n, seed=seed)
    config["loss"]["name"] = study_loss(base["loss"]["name"], loss)
    if temperature is not None:
        config["loss"]["temperature"] = temperature
    config["negatives"].update(regime=regime, m=m, m_fraction=None, seed=seed)
    b = grid.batch(n, batch_size)
    config["train"].update(seed=seed, batch_size=b, epochs=None,
                           steps=None, max_samples=grid.samples(n, b), eval_every=None,
                           checkpoint_every=None, checkpoint_every_s=60.0)
    if device is not None:
        config["train"]["device"] = device
    config["eval"]["probe"] = bool(config["eval"]["probe"] or probe)
    return config


def parse_list(option: str, text: str | None, cast: type[int] | type[float]
               ) -> list[Any] | None:
    """``"500,1500,4000"`` as a list of ``cast`` (None stays None).

    Example:
        >>> parse_list("--ns", "500, 1500", int)
        [500, 1500]
    """
    if text is None:
        return None
    try:
        return [cast(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CrlValueError(f"{option}: expected comma-separated {cast.__name__}s such as "
                            f"{'500,1500,4000' if cast is int else '0.1,0.4,1'}; got {text!r}"
                            ) from None
