"""``fit(config, run_dir)``: train a dual encoder, evaluate it, and write the run directory.

The pieces, each in its own module: what a run is made of (:mod:`crl.train.build`), the batch
order of an epoch (:mod:`crl.train.sampler`), one optimiser step (:mod:`crl.train.step`), the
metrics (:mod:`crl.train.evaluation`) and everything written to disk, on rank 0 only
(:mod:`crl.train.writer`). This module strings them together.

Determinism and resume: the data order of epoch ``e`` depends only on ``(seed, e)``,
augmentations are seeded by ``(seed, epoch, index)`` inside the data set, and a checkpoint stores
the step (hence the epoch and the position in it), the model, objective, optimiser, scheduler and
RNG states. A resumed run skips the batches of the epoch that were consumed and continues bit for
bit like an uninterrupted one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

from crl import __version__, distributed
from crl.env import environment_info
from crl.errors import CrlError, CrlValueError, StaleRunError
from crl.rundir import CHECKPOINT_FILE, METRICS_FILE, SUMMARY_FILE, read_json
from crl.train.build import (
    BuiltRun,
    build_optimizer,
    build_run,
    lr_factor,
    seed_everything,
    trainable,
)
from crl.train.checkpoint import load_checkpoint, rng_state, set_rng_state
from crl.train.config import TrainConfig, config_hash
from crl.train.evaluation import evaluate, evaluate_run, probe_features
from crl.train.progress import TrainProgress
from crl.train.sampler import BatchSampler, build_sampler, epoch_permutation
from crl.train.step import NonFiniteLossError, train_step
from crl.train.writer import RunWriter


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


def _open_run(run_dir: Path, run_id: str,
              resume: bool) -> tuple[RunResult | None, dict[str, Any] | None]:
    """The finished run to return as is, or the checkpoint to resume from (or None)."""
    if resume and (run_dir / SUMMARY_FILE).exists():
        done = read_json(run_dir / SUMMARY_FILE)
        if done.get("run_id") != run_id:
            raise StaleRunError(f"resume: {run_dir} holds the finished run "
                                f"{done.get('run_id')}, not this config ({run_id}); choose "
                                "another --out")
        return RunResult(run_dir, done, int(done["step"]), True), None
    if resume:
        path = run_dir / CHECKPOINT_FILE
        return None, (load_checkpoint(path, config_hash=run_id) if path.exists() else None)
    busy = [name for name in (METRICS_FILE, CHECKPOINT_FILE, SUMMARY_FILE)
            if (run_dir / name).exists()]
    if busy:
        raise CrlError(
            f"run directory {run_dir} already holds {', '.join(busy)}; pass --resume "
            "(resume=True) to continue or finish it, or choose another --out"
        )
    return None, None


def fit(config: TrainConfig, run_dir: str | Path, *, resume: bool = False,
        progress: bool = True, tensorboard: bool = False,
        stop_at: int | None = None) -> RunResult:
    """Train, evaluate and write the run directory (``config.json``, ``metrics.jsonl``,
    ``checkpoint.pt``, then ``summary.json`` last).

    Under torchrun (``WORLD_SIZE`` set), it joins the process group if the caller has not.

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
        CrlError: on a non-empty run directory without ``resume``, a corrupt checkpoint, or a
            non-finite loss (naming the step and the last good checkpoint).
        StaleRunError: on resuming a checkpoint or finished run of another config or crl
            version.
    """
    run_dir = Path(run_dir)
    run_id = config_hash(config)
    if config.train.device.startswith("cuda") and not torch.cuda.is_available():
        raise CrlValueError(f"train.device is {config.train.device!r} but CUDA is not available "
                            "on this machine; use --device cpu")
    distributed.init_from_env(config.train.device)  # a no-op when already joined (the CLI)
    distributed.local_batch_size(config.train.batch_size, distributed.world_size())
    # rank 0 reads the run directory for everyone
    done, checkpoint = distributed.run_on_main(lambda: _open_run(run_dir, run_id, resume))
    if done is not None:
        return done
    device = distributed.device_for(config.train.device)
    threads = torch.get_num_threads()
    if config.train.num_threads is not None:
        torch.set_num_threads(config.train.num_threads)
    try:
        with RunWriter(run_dir, tensorboard=tensorboard) as writer:
            run = _Training.start(config, run_id, checkpoint, device, writer)
            return run.train(stop_at, progress=progress)
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Training:
    """The state of a run being trained, and the three things done with it: steps,
    evaluations and checkpoints."""

    config: TrainConfig
    run_id: str
    built: BuiltRun
    optimizer: Optimizer
    scheduler: LambdaLR
    sampler: BatchSampler
    writer: RunWriter
    device: torch.device
    step: int = 0
    log: dict[str, Any] = field(default_factory=dict)
    last_checkpoint: int | None = None

    @classmethod
    def start(cls, config: TrainConfig, run_id: str, checkpoint: dict[str, Any] | None,
              device: torch.device, writer: RunWriter, built: BuiltRun | None = None
              ) -> _Training:
        """Build the run (unless ``built`` is given), restore the checkpoint if any, and open
        the run directory."""
        built = build_run(config, device) if built is None else built
        total = built.total_steps
        optimizer = build_optimizer(config.optim, trainable([built.model, built.objective]))
        scheduler = LambdaLR(optimizer, lambda s: lr_factor(s, total, config.optim))
        sampler = build_sampler(config.train.sampler, built.splits.train,
                                config.train.batch_size, seed=config.train.seed)
        run = cls(config, run_id, built, optimizer, scheduler, sampler, writer, device)
        if checkpoint is not None:
            built.model.load_state_dict(checkpoint["model"])
            built.objective.load_state_dict(checkpoint["objective"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            scheduler.load_state_dict(checkpoint["scheduler"])
            set_rng_state(checkpoint["rng"])
            run.step = run.last_checkpoint = int(checkpoint["step"])
            run.log = dict(checkpoint.get("last_log", {}))
        splits, n = built.splits, len(built.train_ds)
        writer.start({
            "run_id": run_id, "config": config.model_dump(mode="json"),
            "environment": environment_info(), "data": {
                "name": splits.info.name, "num_train": n, "num_val": len(splits.val),
                "num_test": len(splits.test), "provenance": splits.info.provenance},
            "total_steps": total, "steps_per_epoch": built.steps_per_epoch},
            resumed_at=None if checkpoint is None else run.step)
        return run

    def _epoch(self, at: int) -> float:
        return at / self.built.steps_per_epoch

    def _state(self) -> dict[str, Any]:
        at, per_epoch = self.step, self.built.steps_per_epoch
        return {"model": self.built.model.state_dict(),
                "objective": self.built.objective.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "rng": rng_state(), "step": at,
                "epoch": at // per_epoch, "position": at % per_epoch,
                "config": self.config.model_dump(mode="json"), "config_hash": self.run_id,
                "crl_version": __version__, "last_log": dict(self.log)}

    def evaluate(self, dataset: Any, name: str, *, final: bool = False,
                 train_features: Any = None) -> dict[str, float]:
        """Rank 0 evaluates ``dataset`` and records it; the other ranks get ``{}``."""
        built = self.built
        return self.writer.evaluation(
            lambda: evaluate(built.model, dataset, self.config.eval,
                             temperature=built.objective.temperature(),
                             train_split=built.train_ds, device=self.device,
                             train_features=train_features),
            name=name, step=self.step, epoch=self._epoch(self.step), final=final)

    def _loader(self, epoch: int, position: int) -> DataLoader[Any]:
        batches = self.sampler.batches(epoch, position)
        if distributed.is_active():  # this rank's contiguous slice of each batch
            batches = [distributed.shard(b) for b in batches]
        self.built.train_ds.set_epoch(epoch)
        self.built.objective.set_epoch(epoch)
        # Its own generator: creating a loader must not draw from the global RNG.
        return DataLoader(self.built.train_ds, batch_sampler=batches, collate_fn=default_collate,
                          num_workers=self.config.train.num_workers,
                          generator=torch.Generator().manual_seed(self.config.train.seed))

    def _one_step(self, batch: Any) -> float:
        cfg = self.config.train
        try:
            loss, logs = train_step(
                self.built.model, self.built.objective, batch, self.optimizer, self.scheduler,
                grad_clip=self.config.optim.grad_clip, step=self.step, device=self.device,
                micro_batch_size=cfg.micro_batch_size, precision=cfg.precision)
        except NonFiniteLossError as exc:
            where = (f"the last good checkpoint is {self.writer.run_dir / CHECKPOINT_FILE} at "
                     f"step {self.last_checkpoint}" if self.last_checkpoint is not None
                     else "no checkpoint was written yet")
            raise NonFiniteLossError(
                f"{exc}; stopped without saving the weights; {where} (lower optim.lr, set "
                "optim.grad_clip, or raise loss.temperature)") from None
        self.step += 1
        self.log = {"step": self.step, "epoch": self._epoch(self.step), "train/loss": loss,
                    **logs}
        return loss

    def train(self, stop_at: int | None, *, progress: bool) -> RunResult:
        """Steps up to ``stop_at`` (or the budget), then the final evaluation and summary."""
        cfg, total, per_epoch = self.config.train, self.built.total_steps, \
            self.built.steps_per_epoch
        started = time.perf_counter()
        stop = total if stop_at is None else min(total, stop_at)
        self.built.model.train()
        with TrainProgress(total, self.step, cfg.batch_size,
                           enabled=progress and self.writer.main) as bar:
            while self.step < stop:
                for batch in self._loader(*divmod(self.step, per_epoch)):
                    loss = self._one_step(batch)
                    bar.update(self.step, loss=loss)
                    self.after_step(stop)
                    if self.step >= stop:
                        break
        if self.step < total:
            return RunResult(self.writer.run_dir, {}, self.step, False)
        return self.finish(started)

    def after_step(self, stop: int) -> None:
        """The records, validation and checkpoint due after step ``self.step``."""
        cfg, total = self.config.train, self.built.total_steps
        if self.step % cfg.log_every == 0 or self.step == total:
            self.writer.record(self.log)
        if (cfg.eval_every and self.step % cfg.eval_every == 0
                and self.built.val_ds is not None and self.step < total):
            self.evaluate(self.built.val_ds, "val")
        if (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0) or self.step == stop:
            self.writer.checkpoint(self._state)
            self.last_checkpoint = self.step

    def finish(self, started: float) -> RunResult:
        """The final evaluation and ``summary.json`` (``started``: ``perf_counter`` at the
        start of training)."""
        summary = self._final_summary()
        summary["time/train_eval_s"] = time.perf_counter() - started
        self.writer.summary(summary)
        distributed.barrier()  # every rank returns once summary.json is written
        return RunResult(self.writer.run_dir, summary, self.step, True)

    def _final_summary(self) -> dict[str, Any]:
        built, cfg = self.built, self.config.eval
        summary: dict[str, Any] = {"run_id": self.run_id, "step": self.step,
                                   "epoch": self._epoch(self.step),
                                   "train/loss": self.log.get("train/loss")}
        train_features = None  # computed once for both splits' probes, on rank 0
        if cfg.probe and built.train_ds.labels is not None:
            train_features = self.writer.compute(lambda: (probe_features(
                built.model, built.train_ds, batch_size=cfg.batch_size, device=self.device,
                representation=cfg.probe_features == "representation"), built.train_ds.labels))
        if built.val_ds is not None:
            val = self.evaluate(built.val_ds, "val", final=True, train_features=train_features)
            summary.update({f"val/{key}": value for key, value in val.items()})
        if built.test_ds is not None:
            summary.update(self.evaluate(built.test_ds, "test", final=True,
                                         train_features=train_features))
        return summary


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
