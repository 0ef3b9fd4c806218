"""Grouped training: runs that differ only in their negatives, trained together in one process.

Runs whose configs agree on everything but the ``negatives`` section (a study's runs at one
``(n, seed)``: the same data, the same batches in the same order, the same initial weights) are
trained by :func:`fit_group` on one shared data set and loader, one batch per step for all of
them, and one backward pass of their summed losses. The towers run in one of two ways:

- ``batched=True``: one forward pass of the stacked towers: each linear layer's weights stacked
  ``(G, out, in)`` (``torch.stack``, so the gradients flow back to each run's own parameters)
  and multiplied run by run in one :func:`torch.func.vmap` call, embedding bags one call per
  run; only for towers of :data:`EXACT_MODULES`, whose batched gradients are bit for bit one
  run's;
- ``batched=False``: each run's towers on their own, under the run's RNG state (any towers,
  dropout included).

Each run keeps its own objective (its loss, negative sets, GCL ``u`` state, learnable scales),
its own optimiser and scheduler, its own RNG state and its own run directory, written by the
same code as :func:`crl.train.fit` (``config.json``, ``metrics.jsonl``, ``checkpoint.pt``,
``summary.json`` last). A run's parameters receive only its own loss's gradient, so every run
takes the steps it would take alone, and its files match a lone run's except the timing
(``time/train_eval_s``): ``tests/train/test_grouped.py`` checks metrics records, summaries,
weights, GCL state and RNG state against :func:`crl.train.fit`.

What can be grouped (:func:`group_key` is None otherwise): one process on the CPU, one pass
per step (no ``train.micro_batch_size``), ``fp32``, no hard negatives in the data, towers
without buffers. The CPU saved is the per-run process start, data loading, tokenising and
loader work (benchmarks/README.md, section ``benchmarks/grouped.py``); the dense embedding
gradient and the AdamW update of each run's table cost the same either way.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import vmap

from crl import distributed
from crl.errors import CrlError, CrlValueError
from crl.losses import Objective
from crl.models import DualEncoder
from crl.models.bag import EmbeddingBagEncoder
from crl.models.towers import Tower
from crl.train.build import BuiltRun, build_run, run_objective
from crl.train.checkpoint import rng_state, set_rng_state
from crl.train.config import TrainConfig, config_hash, stable_hash
from crl.train.loop import RunResult, _open_run, _Training
from crl.train.step import (
    _global_value,
    apply_gradients,
    batch_loss,
    embed,
    split_batch,
    tree_map,
)
from crl.train.writer import RunWriter


class GroupingError(CrlError):
    """The runs cannot be trained as a group (train them one at a time)."""


def group_key(config: TrainConfig | dict[str, Any]) -> str | None:
    """Runs with equal keys can be trained together by :func:`fit_group`; None: this run
    trains alone.

    The key is the hash of the config without its ``negatives`` section; a config that asks
    for gradient caching, bf16, a device other than the CPU or more than one thread setting
    that differs is not grouped.

    Example:
        >>> base = {"negatives": {"m": 5}, "train": {"seed": 0}}
        >>> group_key(base) == group_key({**base, "negatives": {"m": 50}})
        True
    """
    data = config.model_dump(mode="json") if isinstance(config, TrainConfig) else config
    train = data.get("train", {})
    if (train.get("micro_batch_size") is not None or train.get("precision", "fp32") != "fp32"
            or str(train.get("device", "cpu")) != "cpu"):
        return None
    return stable_hash({key: value for key, value in data.items() if key != "negatives"})


@contextlib.contextmanager
def _rng(states: list[dict[str, Any]], g: int) -> Iterator[None]:
    """Run with run ``g``'s global RNG state (torch, numpy, python), saved again after."""
    set_rng_state(states[g])
    try:
        yield
    finally:
        states[g] = rng_state()


#: Activations applied element-wise to the runs' stacked activations ``(G, B, ...)``.
ELEMENTWISE: tuple[type[nn.Module], ...] = (nn.Identity, nn.ReLU, nn.GELU, nn.Tanh, nn.SiLU)
#: Module types :class:`_Stacked` runs for ``G`` runs at once, each checked equal, bit for bit,
#: to one run's forward and backward (``tests/train/test_grouped.py``). Layer norm is not among
#: them: its vmapped backward sums the affine gradients in another order (differences of 1e-7
#: that grow over a run), so towers with one train one run at a time.
EXACT_MODULES: tuple[type[nn.Module], ...] = (
    DualEncoder, Tower, EmbeddingBagEncoder, nn.Sequential, nn.Linear, nn.EmbeddingBag,
    nn.Flatten, *ELEMENTWISE)

_linear = vmap(F.linear)  # (G, B, in) x (G, out, in) x (G, out): one product per run


def _stack(tensors: list[Tensor], dim: int, cache: dict[tuple[int, int], Tensor]) -> Tensor:
    """The runs' parameters stacked, once per step (a shared tower uses them for both views; the
    two gradients add up as in one run)."""
    key = (id(tensors[0]), dim)
    if key not in cache:
        cache[key] = torch.stack(tensors) if dim == 0 else torch.cat(tensors, dim=dim)
    return cache[key]


def _bag(bags: list[nn.EmbeddingBag], ids: Tensor) -> Tensor:
    """``G`` embedding bags over the same ids, ``(G, B, d)``: one call per run, as the tables are
    large and the outputs small (side by side in one call, ``(V, G d)``, the tables' copy and the
    copy of its gradient cost more than the calls save; measured in benchmarks/grouped.py)."""
    return torch.stack([bag(ids) for bag in bags])


def _forward(modules: list[nn.Module], x: Tensor, cache: dict[tuple[int, int], Tensor]
             ) -> Tensor:
    """The modules (one per run, of one type) on the runs' inputs ``x (G, B, ...)``; an
    embedding bag takes the runs' shared ids ``(B, L)``."""
    first = modules[0]
    if isinstance(first, Tower):
        towers = cast("list[Tower]", modules)
        inner = _forward([t.backbone for t in towers], x, cache)
        return _forward([t.head for t in towers], inner, cache)
    if isinstance(first, nn.Sequential):
        for layers in zip(*modules, strict=True):
            x = _forward(list(layers), x, cache)
        return x
    if isinstance(first, EmbeddingBagEncoder):
        encoders = cast("list[EmbeddingBagEncoder]", modules)
        return _bag([e.bag for e in encoders], first.bag_ids(x))
    if isinstance(first, nn.Linear):
        linears = cast("list[nn.Linear]", modules)
        weight = _stack([m.weight for m in linears], 0, cache)
        if first.bias is None:
            return vmap(F.linear)(x, weight)  # type: ignore[no-any-return]
        bias = _stack([cast(Tensor, m.bias) for m in linears], 0, cache)
        return _linear(x, weight, bias)  # type: ignore[no-any-return]
    if isinstance(first, nn.Flatten):  # one more leading dimension than a run's
        return x.flatten(first.start_dim + 1, first.end_dim if first.end_dim < 0
                         else first.end_dim + 1)
    if isinstance(first, ELEMENTWISE):
        return first(x)  # type: ignore[no-any-return]
    raise GroupingError(f"grouped training: no grouped forward for {type(first).__name__}")


class _Stacked:
    """The towers of ``G`` runs, run once for all of them on a batch."""

    def __init__(self, models: list[DualEncoder]) -> None:
        first = models[0]
        if any(True for _ in first.buffers()):
            raise GroupingError("grouped training: the towers hold buffers (batch norm)")
        other = sorted({type(m).__name__ for m in first.modules()
                        if type(m) not in EXACT_MODULES})
        if other:
            raise GroupingError(f"grouped training: the towers hold {', '.join(other)}, whose "
                                "batched gradients are not exactly one run's")
        if any([type(m) for m in model.modules()] != [type(m) for m in first.modules()]
               for model in models):
            raise GroupingError("grouped training: the runs' models differ")
        self.models = models

    def _tower(self, towers: list[nn.Module], x: Tensor,
               cache: dict[tuple[int, int], Tensor]) -> Tensor:
        first = towers[0]
        inputs = x if isinstance(_first_leaf(first), EmbeddingBagEncoder) else \
            x.expand(len(towers), *x.shape)  # the same batch for every run
        z = _forward(towers, inputs, cache)
        return F.normalize(z, dim=-1) if self.models[0].normalize else z

    def __call__(self, xa: Tensor, xb: Tensor) -> tuple[Tensor, Tensor]:
        """``za, zb`` of shape ``(G, B, D)``: each run's embeddings of the batch."""
        cache: dict[tuple[int, int], Tensor] = {}
        za = self._tower([m.tower_a for m in self.models], xa, cache)
        zb = self._tower([m.tower_b for m in self.models], xb, cache)
        return za.float(), zb.float()


class _Separate:
    """The towers of ``G`` runs, each on its own (as :func:`crl.train.step.embed`, under the
    run's RNG state): exact for any tower; the batch, the data and the process are shared."""

    def __init__(self, models: list[DualEncoder], states: list[dict[str, Any]]) -> None:
        self.models, self.states = models, states

    def __call__(self, xa: Any, xb: Any) -> tuple[list[Tensor], list[Tensor]]:
        za, zb = [], []
        for g, model in enumerate(self.models):
            with _rng(self.states, g):
                a, b, _ = embed(model, xa, xb, None, contextlib.nullcontext())
            za.append(a)
            zb.append(b)
        return za, zb


def _first_leaf(module: nn.Module) -> nn.Module:
    """The module a tower's input goes to first."""
    while isinstance(module, (Tower, nn.Sequential)) and len(list(module.children())):
        module = module.backbone if isinstance(module, Tower) else module[0]
    return module


_Towers = _Stacked | _Separate


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
              batched: bool = True) -> list[RunResult]:
    """Train runs that differ only in their negatives together (module docstring); each run
    directory ends as :func:`crl.train.fit` writes it.

    Args:
        configs: The runs' configs (equal :func:`group_key`).
        run_dirs: One empty (or new) run directory per config.
        batched: One forward pass of the stacked towers for all runs (towers of
            :data:`EXACT_MODULES` only); False: each run's towers on their own (any towers,
            dropout included), sharing the process, the data and the batches.

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
        _open_run(run_dir, config_hash(config), resume=False)  # raises unless empty
    device = torch.device(configs[0].train.device)
    threads = torch.get_num_threads()
    if configs[0].train.num_threads is not None:
        torch.set_num_threads(configs[0].train.num_threads)
    with contextlib.ExitStack() as stack:
        try:
            builts, states = _build(configs, device)
            models = [built.model for built in builts]
            stacked: _Towers = _Stacked(models) if batched else _Separate(models, states)
            runs = []
            for g, (config, run_dir) in enumerate(zip(configs, dirs, strict=True)):
                writer = stack.enter_context(RunWriter(run_dir, main=True))
                with _rng(states, g):
                    runs.append(_Training.start(config, config_hash(config), None, device,
                                                writer, built=builts[g]))
            return _train(runs, states, stacked, device)
        finally:
            torch.set_num_threads(threads)


def _same_rng(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (torch.equal(a["torch"], b["torch"]) and a["python"] == b["python"]
            and torch.equal(a["numpy"]["key"], b["numpy"]["key"])
            and a["numpy"]["pos"] == b["numpy"]["pos"])


def _build(configs: Sequence[TrainConfig], device: torch.device
           ) -> tuple[list[BuiltRun], list[dict[str, Any]]]:
    """Each run as :func:`~crl.train.build.build_run` makes it, and the RNG state after: the
    first built in full, the others sharing its data and a copy of its initial model (the same
    seed and model config: the same weights) with their own objective, unless building that
    objective draws random numbers (then in full too)."""
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
    quiet = _same_rng(states[0], rng_state())
    set_rng_state(states[0])
    for config in configs[1:]:
        made = objective(config)
        if quiet and _same_rng(states[0], rng_state()):
            builts.append(replace(first, model=copy.deepcopy(first.model), objective=made))
        else:
            builts.append(build_run(config, device))
        states.append(rng_state())
    return builts, states


def _train(runs: list[_Training], states: list[dict[str, Any]], stacked: _Towers,
           device: torch.device) -> list[RunResult]:
    """Every step of every run, then each run's final evaluation and summary."""
    lead = runs[0]
    total, per_epoch = lead.built.total_steps, lead.built.steps_per_epoch
    if any(r.built.total_steps != total or r.built.steps_per_epoch != per_epoch for r in runs):
        raise GroupingError("grouped training: the runs' schedules differ")
    started = time.perf_counter()
    for run in runs:
        run.built.model.train()
    while lead.step < total:
        epoch, position = divmod(lead.step, per_epoch)
        for g, run in enumerate(runs[1:], start=1):  # the lead's loader sets its own epoch
            with _rng(states, g):
                run.built.train_ds.set_epoch(epoch)
                run.built.objective.set_epoch(epoch)
        with _rng(states, 0):
            loader = lead._loader(epoch, position)
        for batch in loader:
            _group_step(runs, states, stacked, batch, device)
            for g, run in enumerate(runs):
                with _rng(states, g):
                    run.after_step(total)
            if lead.step >= total:
                break
    results = []
    for g, run in enumerate(runs):
        with _rng(states, g):
            results.append(run.finish(started))
    return results


def _group_step(runs: list[_Training], states: list[dict[str, Any]], stacked: _Towers,
                batch: Any, device: torch.device) -> None:
    """One optimiser step of every run on the same batch: one vmapped forward, the runs'
    losses, one backward pass of their sum, then each run's clip, optimiser and scheduler."""
    xa, xb, index, labels, xh = split_batch(batch)
    if xh is not None:
        raise GroupingError("grouped training: the batch has hard negatives")
    xa, xb = tree_map(lambda t: t.to(device), (xa, xb))
    index, labels = index.to(device), labels.to(device)
    for run in runs:
        run.optimizer.zero_grad(set_to_none=True)
    before = torch.get_rng_state()
    za, zb = stacked(xa, xb)
    if isinstance(stacked, _Stacked) and not torch.equal(before, torch.get_rng_state()):
        raise GroupingError("grouped training: the towers draw random numbers in training")
    losses, values, logs = [], [], []
    for g, run in enumerate(runs):
        with _rng(states, g):
            loss, log = batch_loss(run.built.objective, run.built.model, (za[g], zb[g], None),
                                   index, labels)
            values.append(_global_value(loss, run.step))
        losses.append(loss)
        logs.append(log)
    torch.stack(losses).sum().backward()  # type: ignore[no-untyped-call]
    for g, run in enumerate(runs):
        with _rng(states, g):
            log = apply_gradients(run.built.objective, run.optimizer, run.scheduler, logs[g],
                                  grad_clip=run.config.optim.grad_clip, step=run.step)
        run.step += 1
        run.log = {"step": run.step, "epoch": run._epoch(run.step), "train/loss": values[g],
                   **log}


__all__ = ["GroupingError", "fit_group", "group_key"]
