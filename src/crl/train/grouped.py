"""Grouped training: runs that differ only in their negatives, trained together in one process.

Runs whose configs agree on everything but the ``negatives`` section (a study's runs at one
``(n, seed)``: the same data, the same batches in the same order, the same initial weights) are
trained by :func:`fit_group` on one shared data set and loader, one batch per step for all of
them, through the loop of :func:`crl.train.fit` (:class:`~crl.train.trainer.Trainer`) with the
group step (:class:`~crl.train.steps.GroupStep`): one backward pass of their summed losses. The
towers run in one of two ways (:mod:`crl.train.steps.towers`):

- ``batched=True``: one forward pass of the stacked towers (:class:`StackedTowers`), only for
  towers of :data:`EXACT_MODULES`, whose batched gradients are bit for bit one run's; and
  where the runs' objectives are plain GCL with fixed temperatures, their losses in one
  computation (:func:`crl.losses.gcl_group.grouped_gcl`, chosen here once: the same losses
  and gradients, bit for bit);
- ``batched=False``: each run's towers on their own, under the run's RNG stream
  (:class:`SeparateTowers`: any towers, dropout included).

Each run keeps its own objective (its loss, negative sets, GCL ``u`` state, learnable scales;
sets of the same ``n``, regime, seed and labels rank each batch once for all their sizes ``m``,
:func:`crl.negatives.share_ranks`, with the same masks), its own optimiser and scheduler, its
own RNG stream (:class:`OwnRng`) and its own run directory, written by the same
:class:`~crl.train.RunWriter` as :func:`crl.train.fit` (``config.json``, ``metrics.jsonl``,
``checkpoint.pt``, ``summary.json`` last). A run's parameters receive only its own loss's
gradient, so every run takes the steps it would take alone, and its files match a lone run's
except the timing (the ``time/*`` entries: a run's share of the group's time, and the
group's, :mod:`crl.train.timing`): ``tests/train/test_grouped.py`` checks metrics records,
summaries, weights, GCL state and RNG state against :func:`crl.train.fit`.

What can be grouped (:func:`group_key` is None otherwise): one process on the CPU, one pass
per step (no ``train.micro_batch_size``), ``fp32``, no hard negatives in the data, towers
without buffers. The CPU saved is the per-run process start, data loading, tokenising and
loader work (benchmarks/README.md, section ``benchmarks/grouped.py``), and all but one
permutation of each batch per family of negative sets (the study's n = 15,000 group: the masks
from 18.7 to 4.5 CPU-s); the dense embedding gradient and the AdamW update of each run's table
cost the same either way.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from crl import distributed
from crl.errors import CrlValueError
from crl.losses import Objective
from crl.losses.gcl_group import grouped_gcl
from crl.models import DualEncoder
from crl.negatives import NegativeSets, share_ranks
from crl.train.build import BuiltRun, build_run, run_objective
from crl.train.checkpoint import rng_state, same_rng_state, set_rng_state
from crl.train.config import TrainConfig, config_hash, stable_hash
from crl.train.steps import GroupingError, GroupStep, SeparateTowers, StackedTowers
from crl.train.steps.group import Towers
from crl.train.steps.towers import EXACT_MODULES
from crl.train.trainer import RunResult, Trainer, TrainingRun, open_run
from crl.train.writer import RunWriter


def group_key(config: TrainConfig | dict[str, Any]) -> str | None:
    """Runs with equal keys can be trained together by :func:`fit_group`; None: this run
    trains alone.

    The key is the hash of the config without its ``negatives`` section; a config that asks
    for gradient caching, bf16, a device other than the CPU, a guide (``loss.guide``) or more
    than one thread setting that differs is not grouped.

    Example:
        >>> base = {"negatives": {"m": 5}, "train": {"seed": 0}}
        >>> group_key(base) == group_key({**base, "negatives": {"m": 50}})
        True
    """
    data = config.model_dump(mode="json") if isinstance(config, TrainConfig) else config
    train = data.get("train", {})
    if (train.get("micro_batch_size") is not None or train.get("micro_batch_tokens") is not None
            or train.get("precision", "fp32") != "fp32"
            or str(train.get("device", "cpu")) != "cpu"
            or (data.get("loss") or {}).get("guide") is not None):
        return None
    return stable_hash({key: value for key, value in data.items() if key != "negatives"})


class OwnRng(AbstractContextManager[None]):
    """A run's own global RNG stream (torch, numpy, python): set while the run is active, saved
    again when it is left, so that each run of a group draws what it would draw alone.

    Example:
        >>> one, two = OwnRng(rng_state()), OwnRng(rng_state())
        >>> with one:
        ...     a = torch.rand(2)
        >>> with two:  # the same start: the same draws, whatever `one` drew
        ...     b = torch.rand(2)
        >>> torch.equal(a, b)
        True
    """

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def __enter__(self) -> None:
        set_rng_state(self.state)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.state = rng_state()


def _check_group(configs: Sequence[TrainConfig], run_dirs: Sequence[Path]) -> None:
    if not configs or len(configs) != len(run_dirs):
        raise CrlValueError(f"fit_group: `configs` and `run_dirs` must be non-empty and of "
                            f"equal length; got {len(configs)} and {len(run_dirs)}")
    keys = {group_key(c) for c in configs}
    if None in keys or len(keys) != 1:
        raise CrlValueError("fit_group: the configs must agree on everything but the "
                            "negatives section, on the CPU, fp32, without micro-batches; got "
                            f"{len(keys)} different groups")
    if len({Path(d).resolve() for d in run_dirs}) != len(run_dirs):
        raise CrlValueError("fit_group: every run needs its own run directory")
    if distributed.is_active():
        raise GroupingError("fit_group: one process only (not under torchrun)")


def fit_group(configs: Sequence[TrainConfig], run_dirs: Sequence[str | Path], *,
              batched: bool = True, final_checkpoint: bool = True) -> list[RunResult]:
    """Train runs that differ only in their negatives together (module docstring); each run
    directory ends as :func:`crl.train.fit` writes it.

    Args:
        configs: The runs' configs (equal :func:`group_key`).
        run_dirs: One empty (or new) run directory per config.
        batched: One forward pass of the stacked towers for all runs (towers of
            :data:`EXACT_MODULES` only), and GCL's losses in one computation where
            :func:`~crl.losses.gcl_group.grouped_gcl` takes them; False: each run's towers
            and objective on their own (any towers, dropout included), sharing the process,
            the data and the batches.
        final_checkpoint: Write each run's ``checkpoint.pt`` after its last step (False: for
            runs whose weights are not kept; :class:`~crl.train.trainer.Trainer`).

    Returns:
        One finished :class:`~crl.train.RunResult` per run, in order.

    Raises:
        CrlValueError: for configs of different groups or shared run directories.
        CrlError: for a run directory that already holds a run (finish it with
            ``fit(..., resume=True)``); :class:`GroupingError` for hard negatives, towers with
            buffers or, when batched, towers not of :data:`EXACT_MODULES`; a non-finite loss
            (the run directories then hold their last checkpoints).
    """
    dirs = [Path(d) for d in run_dirs]
    _check_group(configs, dirs)
    for config, run_dir in zip(configs, dirs, strict=True):
        open_run(run_dir, config_hash(config), resume=False)  # raises unless empty
    device = torch.device(configs[0].train.device)
    threads = torch.get_num_threads()
    if configs[0].train.num_threads is not None:
        torch.set_num_threads(configs[0].train.num_threads)
    with contextlib.ExitStack() as stack:
        try:
            builts, rngs = _build(configs, device)
            towers: Towers = StackedTowers([b.model for b in builts]) if batched \
                else SeparateTowers()
            losses = grouped_gcl([b.objective for b in builts],
                                 configs[0].train.batch_size) if batched else None
            runs = [TrainingRun.start(config, stack.enter_context(RunWriter(run_dir, main=True)),
                                      device, built=built, rng=rng)
                    for config, run_dir, built, rng in zip(configs, dirs, builts, rngs,
                                                           strict=True)]
            return Trainer(runs, GroupStep(towers, losses),
                           final_checkpoint=final_checkpoint).train()
        finally:
            torch.set_num_threads(threads)


def _copy_model(model: DualEncoder) -> DualEncoder:
    """A copy of ``model``'s modules and weights that shares its text featurizer (a
    tokenizer and its memo of every text tokenised: the same function of the texts for every
    run, and copying it cost more than the weights)."""
    featurizer = model.text_featurizer
    shared = {} if featurizer is None or isinstance(featurizer, torch.nn.Module) \
        else {id(featurizer): featurizer}
    return copy.deepcopy(model, memo=shared)


def _build(configs: Sequence[TrainConfig], device: torch.device
           ) -> tuple[list[BuiltRun], list[OwnRng]]:
    """Each run as :func:`~crl.train.build.build_run` makes it, and its RNG stream after: the
    first built in full, the others sharing its data and a copy of its initial model (the same
    seed and model config: the same weights) with their own objective, unless building that
    objective draws random numbers (then in full too). Their negative sets that differ only in
    ``m`` then share their ranks (:func:`~crl.negatives.share_ranks`)."""
    if any(config.loss.guide is not None for config in configs):
        raise GroupingError("grouped training: loss.guide (each run's objective holds it)")
    first = build_run(configs[0], device)
    if first.train_ds.num_hard_negatives:
        raise GroupingError("grouped training: the data has hard negatives")
    builts, states = [first], [rng_state()]
    epochs = math.ceil(first.total_steps / first.steps_per_epoch)  # as build_run has it

    def objective(config: TrainConfig) -> Objective:
        return run_objective(config, num_samples=len(first.train_ds),
                             labels=first.train_ds.labels, epochs=epochs,
                             num_classes=first.splits.info.num_classes).to(device)

    objective(configs[0])  # does building an objective draw? (then states[0] holds draws)
    quiet = same_rng_state(states[0], rng_state())
    set_rng_state(states[0])
    for config in configs[1:]:
        made = objective(config)
        if quiet and same_rng_state(states[0], rng_state()):
            builts.append(replace(first, model=_copy_model(first.model), objective=made))
        else:
            builts.append(build_run(config, device))
        states.append(rng_state())
    share_ranks(sets for built in builts for sets in _negative_sets(built.objective))
    return builts, [OwnRng(state) for state in states]


def _negative_sets(objective: Objective) -> list[NegativeSets]:
    """The negative sets ``objective`` asks (its own, and its Matryoshka prefixes')."""
    return [module.negatives.sets for module in objective.modules()
            if isinstance(module, Objective) and module.negatives.sets is not None]


__all__ = ["EXACT_MODULES", "GroupingError", "OwnRng", "fit_group", "group_key"]
