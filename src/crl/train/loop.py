"""``fit(config, run_dir)``: train a dual encoder, evaluate it, and write the run directory.

Determinism and resume: the data order of epoch ``e`` is a permutation drawn from a dedicated
``torch.Generator`` seeded by ``(seed, e)``, augmentations are seeded by ``(seed, epoch, index)``
inside the data set, and a checkpoint stores the step and the position in the epoch, the model,
objective, optimiser, scheduler and RNG states. A resumed run skips the batches of the epoch that
were consumed and continues bit for bit like an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim import SGD, AdamW, Optimizer
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

from crl import __version__, distributed
from crl.data import load_data
from crl.env import environment_info
from crl.errors import CrlError, CrlValueError
from crl.models import DualEncoder, build_model
from crl.rundir import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    EVAL_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    append_jsonl,
    read_json,
    read_jsonl,
    remove_temporaries,
    rewrite_jsonl,
    write_json,
)
from crl.train.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from crl.train.config import OptimConfig, TrainConfig, config_hash, validate_config
from crl.train.evaluation import evaluate, probe_features
from crl.train.objective import Objective
from crl.train.progress import TensorBoardWriter, TrainProgress


@dataclass(frozen=True)
class RunResult:
    """What :func:`fit` returns.

    Attributes:
        run_dir: The run directory.
        summary: The final metrics (the content of ``summary.json``); empty when the run stopped
            early at ``stop_at``.
        step: The last completed optimiser step.
        finished: True when the whole budget ran and ``summary.json`` was written.
    """

    run_dir: Path
    summary: dict[str, Any]
    step: int
    finished: bool


class NonFiniteLossError(CrlError):
    """The training loss became NaN or Inf."""


def seed_everything(seed: int) -> None:
    """Seed torch, numpy and python's RNGs."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (code that uses the global RNG)
    random.seed(seed)


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> Tensor:
    """The data order of an epoch: a permutation of ``range(num_samples)`` that depends only on
    ``(seed, epoch)``.

    Example:
        >>> torch.equal(epoch_permutation(10, 0, 3), epoch_permutation(10, 0, 3))
        True
        >>> torch.equal(epoch_permutation(10, 0, 3), epoch_permutation(10, 0, 4))
        False
    """
    digest = hashlib.sha256(f"crl-data-order:{seed}:{epoch}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    return torch.randperm(num_samples, generator=generator)


def build_optimizer(cfg: OptimConfig, params: list[nn.Parameter]) -> Optimizer:
    """AdamW or SGD over ``params``."""
    if cfg.name == "adamw":
        return AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    return SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def lr_factor(step: int, total: int, cfg: OptimConfig) -> float:
    """The learning-rate multiplier at ``step``: linear warm-up, then cosine or constant.

    Example:
        >>> cfg = OptimConfig(warmup_steps=10, min_lr_ratio=0.0)
        >>> lr_factor(4, 110, cfg), lr_factor(10, 110, cfg), lr_factor(110, 110, cfg)
        (0.5, 1.0, 0.0)
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(total - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _trainable(modules: list[nn.Module]) -> list[nn.Parameter]:
    seen: set[int] = set()
    params = []
    for module in modules:
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def train_step(model: nn.Module, objective: Objective, batch: Any, optimizer: Optimizer,
               scheduler: LambdaLR, *, grad_clip: float | None, step: int,
               device: torch.device) -> tuple[float, dict[str, float]]:
    """One optimiser step on a batch ``(view_a, view_b, index, label)``.

    Raises:
        NonFiniteLossError: before any parameter changes, when the loss or the gradients are
            not finite.
    """
    xa, xb, index, labels = batch
    xa, xb = xa.to(device), xb.to(device)
    index, labels = index.to(device), labels.to(device)
    za, zb = model(xa, xb)  # (B, D) each
    rows = None
    if distributed.is_active():  # the global batch, in rank order (docs/distributed.md)
        za, zb = distributed.all_gather_with_grad(za), distributed.all_gather_with_grad(zb)
        index, labels = distributed.all_gather_tensor(index), distributed.all_gather_tensor(labels)
        rows = distributed.own_rows(za.shape[0])  # this rank's anchors against all columns
    loss, logs = objective(za, zb, index, labels, model, rows=rows)
    # The ranks' values average to the global batch's loss (the same number on every rank).
    value = float(distributed.all_reduce_sum(loss.detach().reshape(1))) / distributed.world_size()
    if not math.isfinite(value):
        raise NonFiniteLossError(f"the training loss is {value} at step {step + 1}")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    distributed.average_gradients(params)
    max_norm = grad_clip if grad_clip is not None else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if not bool(torch.isfinite(norm)):
        raise NonFiniteLossError(f"the gradient norm is {float(norm)} at step {step + 1}")
    logs["train/lr"] = float(optimizer.param_groups[0]["lr"])  # the rate of this step
    optimizer.step()
    scheduler.step()
    clamp = getattr(model, "clamp_logit_scale_", None)
    if callable(clamp):
        clamp()
    logs["train/grad_norm"] = float(norm)
    return value, logs


@dataclass
class BuiltRun:
    """The data, model and objective of a config, ready to train or evaluate."""

    splits: Any
    model: DualEncoder
    objective: Objective
    train_ds: Any
    val_ds: Any | None
    test_ds: Any | None
    steps_per_epoch: int
    total_steps: int


def build_run(config: TrainConfig, device: torch.device) -> BuiltRun:
    """Load the data, build the model (seeded by ``train.seed``) and the objective.

    Raises:
        CrlValueError: if the batch is larger than the training split.
    """
    seed_everything(config.train.seed)
    splits = load_data(config.data)
    model = build_model(config.model, splits.info).to(device)
    train_ds = model.prepare(splits.train)
    val_ds = model.prepare(splits.val) if len(splits.val) >= 2 else None
    test_ds = model.prepare(splits.test) if len(splits.test) >= 2 else None
    n = len(train_ds)
    per_epoch = config.train.steps_per_epoch(n)
    if per_epoch < 1:
        raise CrlValueError(f"train.batch_size must be at most the number of training pairs "
                            f"n = {n}; got {config.train.batch_size}")
    total = config.train.total_steps(n)
    objective = Objective(config.loss, config.negatives, num_samples=n, labels=train_ds.labels,
                          epochs=math.ceil(total / per_epoch),
                          num_classes=splits.info.num_classes).to(device)
    return BuiltRun(splits, model, objective, train_ds, val_ds, test_ds, per_epoch, total)


def _check_run_dir(run_dir: Path, resume: bool) -> None:
    if resume:
        return
    busy = [name for name in (METRICS_FILE, CHECKPOINT_FILE, SUMMARY_FILE)
            if (run_dir / name).exists()]
    if busy:
        raise CrlError(
            f"run directory {run_dir} already holds {', '.join(busy)}; pass --resume "
            "(resume=True) to continue or finish it, or choose another --out"
        )


def _open_run(run_dir: Path, run_id: str,
              resume: bool) -> tuple[RunResult | None, dict[str, Any] | None]:
    """The finished run to return as is, or the checkpoint to resume from (or None)."""
    if resume and (run_dir / SUMMARY_FILE).exists():
        done = read_json(run_dir / SUMMARY_FILE)
        if done.get("run_id") != run_id:
            raise CrlError(f"resume: {run_dir} holds the finished run {done.get('run_id')}, "
                           f"not this config ({run_id}); choose another --out")
        return RunResult(run_dir, done, int(done["step"]), True), None
    _check_run_dir(run_dir, resume)
    if resume and (run_dir / CHECKPOINT_FILE).exists():
        return None, load_checkpoint(run_dir / CHECKPOINT_FILE, config_hash=run_id)
    return None, None


def fit(config: TrainConfig, run_dir: str | Path, *, resume: bool = False,
        progress: bool = True, tensorboard: bool = False,
        stop_at: int | None = None) -> RunResult:
    """Train, evaluate and write the run directory (``config.json``, ``metrics.jsonl``,
    ``checkpoint.pt``, then ``summary.json`` last).

    Args:
        config: The run config.
        run_dir: The run directory (created if needed).
        resume: Continue from ``checkpoint.pt`` (a finished run is returned as is).
        progress: Show a progress bar (only on a terminal).
        tensorboard: Also write TensorBoard event files (needs ``tensorboard``).
        stop_at: Stop after this global step, with a checkpoint and without a summary (for
            preemptible jobs); ``fit(..., resume=True)`` continues it.

    Returns:
        A :class:`RunResult`.

    Raises:
        CrlError: on a non-empty run directory without ``resume``, a checkpoint of another config
            or crl version, a corrupt checkpoint, or a non-finite loss (naming the step and the
            last good checkpoint).
    """
    run_dir = Path(run_dir)
    run_id = config_hash(config)
    if config.train.device.startswith("cuda") and not torch.cuda.is_available():
        raise CrlValueError(f"train.device is {config.train.device!r} but CUDA is not available "
                            "on this machine; use --device cpu")
    # Under torchrun: join the process group; rank 0 reads the run directory for everyone.
    distributed.init_from_env(config.train.device)
    distributed.local_batch_size(config.train.batch_size, distributed.world_size())
    done, checkpoint = distributed.run_on_main(lambda: _open_run(run_dir, run_id, resume))
    if done is not None:
        return done
    device = distributed.device_for(config.train.device)
    threads = torch.get_num_threads()
    if config.train.num_threads is not None:
        torch.set_num_threads(config.train.num_threads)
    try:
        return _fit(config, run_dir, run_id, checkpoint, device, progress=progress,
                    tensorboard=tensorboard, stop_at=stop_at)
    finally:
        torch.set_num_threads(threads)


def _fit(config: TrainConfig, run_dir: Path, run_id: str, checkpoint: dict[str, Any] | None,
         device: torch.device, *, progress: bool, tensorboard: bool,
         stop_at: int | None) -> RunResult:
    built = build_run(config, device)
    model, objective, train_ds = built.model, built.objective, built.train_ds
    val_ds, test_ds, splits = built.val_ds, built.test_ds, built.splits
    n, per_epoch, total = len(train_ds), built.steps_per_epoch, built.total_steps
    optimizer = build_optimizer(config.optim, _trainable([model, objective]))
    scheduler = LambdaLR(optimizer, lambda s: lr_factor(s, total, config.optim))

    step = 0
    log: dict[str, Any] = {}
    main = distributed.is_main()
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        objective.load_state_dict(checkpoint["objective"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        set_rng_state(checkpoint["rng"])
        step = int(checkpoint["step"])
        log = dict(checkpoint.get("last_log", {}))
        if main:  # rank 0 alone writes the run directory
            remove_temporaries(run_dir)  # left by a write the crash interrupted
            kept = [r for r in read_jsonl(run_dir / METRICS_FILE)
                    if int(r.get("step", 0)) <= step and not r.get("final")]
            rewrite_jsonl(run_dir / METRICS_FILE, kept)
    elif main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / METRICS_FILE).write_text("")
    if main:
        write_json(run_dir / CONFIG_FILE, {
            "run_id": run_id, "config": config.model_dump(mode="json"),
            "environment": environment_info(), "data": {
                "name": splits.info.name, "num_train": n, "num_val": len(splits.val),
                "num_test": len(splits.test), "provenance": splits.info.provenance},
            "total_steps": total, "steps_per_epoch": per_epoch})

    writer = TensorBoardWriter(run_dir) if tensorboard and main else None
    last_ckpt_step: int | None = step if checkpoint is not None else None

    def record(entry: dict[str, Any]) -> None:
        if not main:
            return
        append_jsonl(run_dir / METRICS_FILE, entry)
        if writer is not None:
            writer.scalars(entry, int(entry["step"]))

    def save(at: int) -> None:
        nonlocal last_ckpt_step
        last_ckpt_step = at
        if not main:
            return
        save_checkpoint(run_dir / CHECKPOINT_FILE, {
            "model": model.state_dict(), "objective": objective.state_dict(),
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "rng": rng_state(), "step": at, "epoch": at // per_epoch,
            "position": at % per_epoch, "config": config.model_dump(mode="json"),
            "config_hash": run_id, "crl_version": __version__, "last_log": dict(log)})

    def run_eval(split: Any, name: str, at: int, final: bool = False,
                 train_features: tuple[Tensor, Tensor] | None = None) -> dict[str, float]:
        if not main:  # rank 0 evaluates; the others go on (or wait at the final barrier)
            return {}
        metrics = evaluate(model, split, config.eval, temperature=objective.temperature(model),
                           train_split=train_ds, device=device, train_features=train_features)
        entry: dict[str, Any] = {"step": at, "epoch": at / per_epoch, "split": name, **metrics}
        if final:
            entry["final"] = True
        record(entry)
        return metrics

    started = time.perf_counter()
    stop = total if stop_at is None else min(total, stop_at)
    model.train()
    try:
        with TrainProgress(total, step, config.train.batch_size,
                           enabled=progress and main) as bar:
            while step < stop:
                epoch, position = divmod(step, per_epoch)
                order = epoch_permutation(n, config.train.seed, epoch)
                batches = [order[b * config.train.batch_size:(b + 1) * config.train.batch_size]
                           .tolist() for b in range(position, per_epoch)]
                if distributed.is_active():  # this rank's contiguous slice of each batch
                    batches = [distributed.shard(b) for b in batches]
                train_ds.set_epoch(epoch)
                objective.set_epoch(epoch)
                # Its own generator: creating a loader must not draw from the global RNG.
                loader = DataLoader(train_ds, batch_sampler=batches, collate_fn=default_collate,
                                    num_workers=config.train.num_workers,
                                    generator=torch.Generator().manual_seed(config.train.seed))
                for batch in loader:
                    try:
                        loss, logs = train_step(model, objective, batch, optimizer, scheduler,
                                                grad_clip=config.optim.grad_clip, step=step,
                                                device=device)
                    except NonFiniteLossError as exc:
                        where = (f"the last good checkpoint is {run_dir / CHECKPOINT_FILE} at "
                                 f"step {last_ckpt_step}" if last_ckpt_step is not None
                                 else "no checkpoint was written yet")
                        raise NonFiniteLossError(
                            f"{exc}; stopped without saving the weights; {where} (lower "
                            "optim.lr, set optim.grad_clip, or raise loss.temperature)") from None
                    step += 1
                    bar.update(step, loss=loss)
                    log = {"step": step, "epoch": step / per_epoch, "train/loss": loss, **logs}
                    if step % config.train.log_every == 0 or step == total:
                        record(log)
                    if (config.train.eval_every and step % config.train.eval_every == 0
                            and val_ds is not None and step < total):
                        run_eval(val_ds, "val", step)
                    if (config.train.checkpoint_every and step % config.train.checkpoint_every
                            == 0) or step == stop:
                        save(step)
                    if step >= stop:
                        break
        if step < total:
            return RunResult(run_dir, {}, step, False)
        summary: dict[str, Any] = {"run_id": run_id, "step": step, "epoch": step / per_epoch,
                                   "train/loss": log.get("train/loss")}
        train_features = None
        if config.eval.probe and train_ds.labels is not None and main:
            train_features = (probe_features(
                model, train_ds, batch_size=config.eval.batch_size, device=device,
                representation=config.eval.probe_features == "representation"), train_ds.labels)
        if val_ds is not None:
            for key, value in run_eval(val_ds, "val", step, True, train_features).items():
                summary[f"val/{key}"] = value
        if test_ds is not None:
            summary.update(run_eval(test_ds, "test", step, True, train_features))
        summary["time/train_eval_s"] = time.perf_counter() - started
        if main:
            write_json(run_dir / SUMMARY_FILE, summary)
    finally:
        if writer is not None:
            writer.close()
    distributed.barrier()  # every rank returns once summary.json is written
    return RunResult(run_dir, summary, step, True)


def evaluate_run(run_dir: str | Path, *, split: str = "test",
                 device: str | None = None) -> dict[str, float]:
    """Re-evaluate a run from its ``config.json`` and ``checkpoint.pt``; write ``eval.json``.

    Args:
        run_dir: A run directory written by :func:`fit`.
        split: ``"test"`` or ``"val"``.
        device: Where to run (None: the run's ``train.device``).

    Returns:
        The metrics (also written, with the step and split, to ``eval.json`` atomically).

    Raises:
        CrlError: if the directory has no config or checkpoint, or they do not match.
    """
    run_dir = Path(run_dir)
    if split not in ("test", "val"):
        raise CrlValueError(f"evaluate_run: `split` must be 'test' or 'val'; got {split!r}")
    if not (run_dir / CONFIG_FILE).is_file():
        raise CrlError(f"evaluate_run: {run_dir} is not a run directory (no {CONFIG_FILE})")
    stored = read_json(run_dir / CONFIG_FILE)
    config = validate_config(stored.get("config", {}), str(run_dir / CONFIG_FILE))
    state = load_checkpoint(run_dir / CHECKPOINT_FILE, config_hash=config_hash(config))
    target = torch.device(device or config.train.device)
    built = build_run(config, target)
    built.model.load_state_dict(state["model"])
    built.objective.load_state_dict(state["objective"])
    dataset = built.test_ds if split == "test" else built.val_ds
    if dataset is None:
        raise CrlValueError(f"evaluate_run: the {split} split has fewer than 2 items")
    metrics = evaluate(built.model, dataset, config.eval,
                       temperature=built.objective.temperature(built.model),
                       train_split=built.train_ds, device=target)
    write_json(run_dir / EVAL_FILE, {"run_id": config_hash(config), "step": int(state["step"]),
                                     "split": split, "metrics": metrics})
    return metrics


__all__ = [
    "BuiltRun",
    "NonFiniteLossError",
    "RunResult",
    "build_optimizer",
    "build_run",
    "epoch_permutation",
    "evaluate_run",
    "fit",
    "lr_factor",
    "seed_everything",
    "train_step",
]
