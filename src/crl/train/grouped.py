"""Grouped training: runs that differ only in their negatives, trained together in one process.

Runs whose configs agree on everything but the ``negatives`` section (a study's runs at one
``(n, seed)``: the same data, the same batches in the same order, the same initial weights) are
trained by :func:`fit_group` in one batched forward and backward pass per step: the runs'
parameters are stacked (``torch.stack``, so the gradients flow back to each run's own
parameters) and the towers run once under :func:`torch.func.vmap` of
:func:`torch.func.functional_call`. Each run keeps its own objective (its loss, negative sets,
GCL ``u`` state, learnable scales), its own optimiser and scheduler, its own RNG state and its own
run directory, written by the same code as :func:`crl.train.fit` (``config.json``,
``metrics.jsonl``, ``checkpoint.pt``, ``summary.json`` last). The losses are summed before one
backward pass; a run's parameters receive only its own loss's gradient, so every run takes the
steps it would take alone, and its files match a lone run's except the timing
(``time/train_eval_s``); the test ``tests/train/test_grouped.py`` checks the summaries and
metrics against :func:`crl.train.fit`.

What can be grouped (:func:`group_key` is None otherwise, and the runs train one at a time):
one process on the CPU, one pass per step (no ``train.micro_batch_size``), ``fp32``, no hard
negatives in the data, towers without buffers and without random draws in training (a vmapped
random op raises; the group then stops and its runs are finished one at a time). See
docs/training.md, "Grouped runs".
"""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from crl import distributed
from crl.errors import CrlError, CrlValueError
from crl.models import DualEncoder
from crl.models.bag import EmbeddingBagEncoder
from crl.models.towers import Tower
from crl.train.build import build_run
from crl.train.checkpoint import rng_state, set_rng_state
from crl.train.config import TrainConfig, config_hash, stable_hash
from crl.train.loop import RunResult, _open_run, _Training
from crl.train.step import _global_value, apply_gradients, batch_loss, split_batch, tree_map
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


#: Module types whose vmapped forward and backward were checked equal, bit for bit, to one run's
#: (``tests/train/test_grouped.py``): linear layers and embedding bags with their containers and
#: element-wise activations. Layer norm is not among them: its vmapped backward sums the affine
#: gradients in another order (differences of 1e-7 that grow over a run), so such towers train
#: one run at a time.
EXACT_MODULES: tuple[type[nn.Module], ...] = (
    DualEncoder, Tower, EmbeddingBagEncoder, nn.Sequential, nn.Linear, nn.EmbeddingBag,
    nn.Flatten, nn.Identity, nn.ReLU, nn.GELU, nn.Tanh, nn.SiLU)


class _Stacked:
    """The towers of ``G`` runs as one vmapped function of their stacked parameters."""

    def __init__(self, models: list[DualEncoder]) -> None:
        first = models[0]
        if any(True for _ in first.buffers()):
            raise GroupingError("grouped training: the towers hold buffers (batch norm)")
        other = sorted({type(m).__name__ for m in first.modules()
                        if type(m) not in EXACT_MODULES})
        if other:
            raise GroupingError(f"grouped training: the towers hold {', '.join(other)}, whose "
                                "batched gradients are not exactly one run's")
        self.size = len(models)
        self.names = [name for name, _ in first.named_parameters()]
        self.params = [dict(m.named_parameters()) for m in models]
        if any(list(p) != self.names for p in self.params):
            raise GroupingError("grouped training: the runs' models differ")
        # A weightless copy to call (functional_call must not touch a run's own model).
        self.model = copy.deepcopy(first).to("meta")

        def one(params: dict[str, Tensor], xa: Any, xb: Any) -> tuple[Tensor, Tensor]:
            za, zb = functional_call(self.model, params, (xa, xb))
            return za.float(), zb.float()

        self.forward = vmap(one, in_dims=(0, 0, 0))

    def __call__(self, xa: Any, xb: Any) -> tuple[Tensor, Tensor]:
        """``za, zb`` of shape ``(G, B, D)``: each run's embeddings of the batch."""
        stacked = {name: torch.stack([p[name] for p in self.params]) for name in self.names}
        # The inputs batched too: vmap then multiplies run by run (a shared input would make
        # one wider product, rounded differently).
        xa, xb = tree_map(lambda t: t.expand(self.size, *t.shape), (xa, xb))
        with warnings.catch_warnings():  # ops without a batching rule run per run: still exact
            warnings.filterwarnings("ignore", message=".*batching rule.*")
            za, zb = self.forward(stacked, xa, xb)
        return za, zb


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


def fit_group(configs: Sequence[TrainConfig], run_dirs: Sequence[str | Path]
              ) -> list[RunResult]:
    """Train runs that differ only in their negatives together (module docstring); each run
    directory ends as :func:`crl.train.fit` writes it.

    Args:
        configs: The runs' configs (equal :func:`group_key`).
        run_dirs: One empty (or new) run directory per config.

    Returns:
        One finished :class:`~crl.train.RunResult` per run, in order.

    Raises:
        CrlValueError: for configs of different groups or shared run directories.
        CrlError: for a run directory that already holds a run (finish it with
            ``fit(..., resume=True)``); :class:`GroupingError` when the towers cannot be
            vmapped; a non-finite loss (the run directories then hold their last checkpoints).
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
            builts, states = [], []
            for config in configs:
                builts.append(build_run(config, device))  # seeds, as fit does: the same start
                states.append(rng_state())
                if builts[-1].train_ds.num_hard_negatives:
                    raise GroupingError("grouped training: the data has hard negatives")
            stacked = _Stacked([built.model for built in builts])  # checked before any write
            runs = []
            for g, (config, run_dir) in enumerate(zip(configs, dirs, strict=True)):
                writer = stack.enter_context(RunWriter(run_dir, main=True))
                with _rng(states, g):
                    runs.append(_Training.start(config, config_hash(config), None, device,
                                                writer, built=builts[g]))
            return _train(runs, states, stacked, device)
        finally:
            torch.set_num_threads(threads)


def _train(runs: list[_Training], states: list[dict[str, Any]], stacked: _Stacked,
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


def _group_step(runs: list[_Training], states: list[dict[str, Any]], stacked: _Stacked,
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
    if not torch.equal(before, torch.get_rng_state()):
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
