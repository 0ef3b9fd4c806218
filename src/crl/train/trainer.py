"""The training loop, once: :class:`Trainer` steps its runs through their batches with the step
strategy it is given, and records, validates and checkpoints each of them.

A :class:`TrainingRun` is one run's state (its built parts, optimiser, schedule, writer, step
count and RNG context) and what is done with it alone: start (build or restore, open the run
directory), evaluate, checkpoint, finish. :func:`crl.train.fit` trains one run;
:func:`crl.train.fit_group` trains runs that differ only in their negatives in lockstep, on one
loader, through the same loop and the same :class:`~crl.train.RunWriter` files.

Which step (one pass, gradient caching, a group's shared towers) is decided once, by the
:class:`~crl.train.step.Step` the trainer is given (:func:`crl.train.steps.build_step`); the loop
never asks again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

from crl import __version__, distributed
from crl.env import environment_info
from crl.errors import CrlValueError
from crl.losses import Objective
from crl.models import DualEncoder
from crl.rundir import CHECKPOINT_FILE
from crl.train.build import (
    BuiltRun,
    build_optimizer,
    build_run,
    lr_factor,
    sparse_parameters,
    trainable,
)
from crl.train.checkpoint import rng_state, set_rng_state
from crl.train.config import TrainConfig, config_hash
from crl.train.evaluation import evaluate, probe_features
from crl.train.progress import TrainProgress
from crl.train.resume import RunResult, open_run
from crl.train.sampler import build_sampler
from crl.train.smoothing import LossSmoother
from crl.train.step import (
    GradientUpdate,
    NonFiniteLossError,
    Step,
    apply_gradients_together,
)
from crl.train.steps.group import shared_inputs, update_group
from crl.train.stop import check_stop
from crl.train.timing import CheckpointClock, Spent, Stopwatch, time_fields
from crl.train.writer import RunWriter


@dataclass
class TrainingRun:
    """One run being trained (a :class:`~crl.train.step.Learner` of the step strategies).

    ``rng`` is entered around everything of this run that may draw random numbers: nothing for
    a lone run; the run's own global RNG stream in a group (:func:`crl.train.fit_group`).
    ``spent`` is the time of the work done for this run alone (its evaluations and checkpoint
    writes, measured by the :class:`Trainer`; :mod:`crl.train.timing`).
    """

    config: TrainConfig
    run_id: str
    built: BuiltRun
    optimizer: Optimizer
    scheduler: LambdaLR
    writer: RunWriter
    device: torch.device
    rng: AbstractContextManager[Any] = field(default_factory=contextlib.nullcontext)
    step: int = 0
    log: dict[str, Any] = field(default_factory=dict)
    last_checkpoint: int | None = None
    spent: Spent = field(default_factory=Spent)
    smoother: LossSmoother = field(default_factory=LossSmoother)

    @property
    def model(self) -> DualEncoder:
        """The run's dual encoder."""
        return self.built.model

    @property
    def objective(self) -> Objective:
        """The run's training objective."""
        return self.built.objective

    @classmethod
    def start(cls, config: TrainConfig, writer: RunWriter, device: torch.device, *,
              checkpoint: dict[str, Any] | None = None, built: BuiltRun | None = None,
              rng: AbstractContextManager[Any] | None = None) -> TrainingRun:
        """Build the run (unless ``built`` is given), restore ``checkpoint`` if any, and open
        the run directory, all under ``rng`` (default: none of its own)."""
        rng = contextlib.nullcontext() if rng is None else rng
        with rng:
            built = build_run(config, device) if built is None else built
            total = built.total_steps
            optimizer = build_optimizer(config.optim, trainable([built.model, built.objective]),
                                        sparse=sparse_parameters([built.model]))
            scheduler = LambdaLR(optimizer, lambda s: lr_factor(s, total, config.optim))
            run = cls(config, config_hash(config), built, optimizer, scheduler, writer, device,
                      rng)
            if checkpoint is not None:
                run._restore(checkpoint)
            splits = built.splits
            writer.start({
                "run_id": run.run_id, "config": config.model_dump(mode="json"),
                "environment": environment_info(), "data": {
                    "name": splits.info.name, "num_train": len(built.train_ds),
                    "num_val": len(splits.val), "num_test": len(splits.test),
                    "provenance": splits.info.provenance, "split": splits.record},
                "total_steps": total, "steps_per_epoch": built.steps_per_epoch},
                resumed_at=None if checkpoint is None else run.step)
        return run

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        self.built.model.load_state_dict(checkpoint["model"])
        self.built.objective.load_state_dict(checkpoint["objective"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        set_rng_state(checkpoint["rng"])
        self.step = self.last_checkpoint = int(checkpoint["step"])
        self.log = dict(checkpoint.get("last_log", {}))
        self.smoother.load_state_dict(checkpoint.get("loss_smoothing"))

    def epoch(self, at: int) -> float:
        """The (fractional) epoch after ``at`` steps."""
        return at / self.built.steps_per_epoch

    def state(self) -> dict[str, Any]:
        """What ``checkpoint.pt`` holds: the weights, optimiser, schedule, RNG and position."""
        at, per_epoch = self.step, self.built.steps_per_epoch
        return {"model": self.built.model.state_dict(),
                "objective": self.built.objective.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "rng": rng_state(), "step": at,
                "epoch": at // per_epoch, "position": at % per_epoch,
                "config": self.config.model_dump(mode="json"), "config_hash": self.run_id,
                "crl_version": __version__, "last_log": dict(self.log),
                "loss_smoothing": self.smoother.state_dict()}

    def update(self, loss: float, logs: dict[str, float]) -> None:
        """The optimiser step on the gradients a step strategy left (:func:`apply_gradients`),
        and the step's log record (:meth:`record_update`)."""
        self.record_update(loss, apply_gradients_together([self.gradient_update(logs)])[0])

    def gradient_update(self, logs: dict[str, float]) -> GradientUpdate:
        """This run's part of an update (:func:`apply_gradients_together`: a group's runs
        step together)."""
        return GradientUpdate(self.built.objective, self.optimizer, self.scheduler, logs,
                              self.config.optim.grad_clip, self.step)

    def record_update(self, loss: float, logs: dict[str, float]) -> None:
        """After the update: the step counted and its log record (the raw loss and its
        smoothed values, :mod:`crl.train.smoothing`)."""
        self.step += 1
        self.log = {"step": self.step, "epoch": self.epoch(self.step), "train/loss": loss,
                    **self.smoother.add(loss), **logs}

    def evaluate(self, dataset: Any, name: str, *, final: bool = False,
                 train_features: Any = None) -> dict[str, float]:
        """Rank 0 evaluates ``dataset`` and records it; the other ranks get ``{}``."""
        built = self.built
        return self.writer.evaluation(
            lambda: evaluate(built.model, dataset, self.config.eval,
                             temperature=built.objective.temperature(),
                             train_split=built.train_ds, device=self.device,
                             train_features=train_features,
                             prefix_dims=built.objective.prefix_dims),
            name=name, step=self.step, epoch=self.epoch(self.step), final=final)

    def checkpoint(self) -> None:
        """Write ``checkpoint.pt`` (rank 0) and remember it as the last good one."""
        self.writer.checkpoint(self.state)
        self.last_checkpoint = self.step

    def finish(self, summary: dict[str, Any]) -> RunResult:
        """Write ``summary`` (:meth:`final_summary` and the run's ``time/*`` entries) as
        ``summary.json``, the last file of the run."""
        self.writer.summary(summary)
        distributed.barrier()  # every rank returns once summary.json is written
        return RunResult(self.writer.run_dir, summary, self.step, True)

    def final_summary(self) -> dict[str, Any]:
        """The final evaluation: the summary's metrics (recorded in ``metrics.jsonl`` too)."""
        built, cfg = self.built, self.config.eval
        summary: dict[str, Any] = {"run_id": self.run_id, "step": self.step,
                                   "epoch": self.epoch(self.step),
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


class Trainer:
    """The loop (nanoGPT's, once for every kind of step): the lead run's batches, one step
    strategy call per batch for all runs, then each run's update, records, validation and
    checkpoints.

    The runs move in lockstep: they share the lead's (the first run's) data, batches, schedule
    and intervals; each keeps its own objective, optimiser, RNG stream and run directory.

    Args:
        runs: The runs, started (:meth:`TrainingRun.start`).
        step: The step strategy (:func:`crl.train.steps.build_step`, or
            :class:`crl.train.steps.GroupStep` for a group).
        final_checkpoint: Write ``checkpoint.pt`` after the last step (False: for runs whose
            weights are dropped once their summary is written; a kill before resumes earlier).

    Raises:
        CrlValueError: for no runs, or runs that differ in what makes the batches or the
            schedule (``data``, ``train.seed``, ``train.batch_size``, ``train.sampler``, the
            number of steps).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from crl.train import load_config
        >>> from crl.train.steps import build_step
        >>> cfg = load_config("synthetic-gaussian", ["train.steps=2", "data.num_train=64",
        ...                   "train.batch_size=16", "model.kind=linear", "eval.probe=false"])
        >>> with RunWriter(Path(tempfile.mkdtemp()) / "run") as writer:
        ...     run = TrainingRun.start(cfg, writer, torch.device("cpu"))
        ...     [result] = Trainer([run], build_step()).train()
        >>> result.finished, result.step
        (True, 2)
    """

    def __init__(self, runs: Sequence[TrainingRun], step: Step, *,
                 final_checkpoint: bool = True) -> None:
        if not runs:
            raise CrlValueError("Trainer: `runs` must hold at least one started run; got none")
        for i, run in enumerate(runs[1:], start=1):
            differ = [name for name, value in _lockstep(run).items()
                      if value != _lockstep(runs[0])[name]]
            if differ:
                raise CrlValueError(f"Trainer: the runs move in lockstep on the first run's "
                                    f"batches; run {i} differs from the first in its "
                                    f"{', '.join(differ)}")
        self.runs, self.step, self.final_checkpoint = list(runs), step, final_checkpoint
        cfg, lead = runs[0].config.train, runs[0].built
        self.checkpoints = CheckpointClock(cfg.checkpoint_every, cfg.checkpoint_every_s)
        self.sampler = build_sampler(cfg.sampler, lead.splits.train, cfg.batch_size,
                                     seed=cfg.seed)

    def train(self, stop_at: int | None = None, *, progress: bool = False) -> list[RunResult]:
        """Steps up to ``stop_at`` (or the budget), then each run's final evaluation and
        summary (:meth:`finish`); stopped early, the runs' unfinished results.

        Raises:
            NonFiniteLossError: for a non-finite loss or gradient (no weights updated by it),
                naming the step and the last good checkpoint.
        """
        lead = self.runs[0]
        total, per_epoch = lead.built.total_steps, lead.built.steps_per_epoch
        stop = total if stop_at is None else min(total, stop_at)
        clock = Stopwatch()
        self.checkpoints.restart()
        for run in self.runs:
            run.built.model.train()
            run.spent = Spent()  # the time of this call's work only
        with TrainProgress(total, lead.step, lead.config.train.batch_size,
                           enabled=progress and lead.writer.main) as bar:
            while lead.step < stop:
                for batch in self._loader(*divmod(lead.step, per_epoch)):
                    for run in self.runs:
                        run.optimizer.zero_grad(set_to_none=True)
                    try:
                        losses = self.step(self.runs, batch)
                        self._update(losses)
                    except NonFiniteLossError as exc:
                        raise self._stopped(exc) from None
                    bar.update(lead.step, loss=losses[0][0],
                               smoothed=lead.log["train/loss_ema"])
                    self._after_step(stop)
                    if lead.step >= stop:
                        break
        if lead.step < total:
            return [RunResult(run.writer.run_dir, {}, run.step, False) for run in self.runs]
        return self.finish(clock)

    def _update(self, losses: list[tuple[float, dict[str, float]]]) -> None:
        """Every run's optimiser step: a lone run's under its RNG context, a group's
        (:func:`~crl.train.steps.group.update_group`) outside."""
        if len(self.runs) > 1:
            update_group(self.runs, losses)
            return
        [run], [(loss, logs)] = self.runs, losses
        with run.rng:
            run.update(loss, logs)

    def _loader(self, epoch: int, position: int) -> DataLoader[Any]:
        """The lead's batches of ``epoch`` from ``position`` on (every run told the epoch)."""
        for run in self.runs:
            with run.rng:
                run.built.train_ds.set_epoch(epoch)
                run.built.objective.set_epoch(epoch)
        batches = self.sampler.batches(epoch, position)
        if distributed.is_active():  # this rank's contiguous slice of each batch
            batches = [distributed.shard(b) for b in batches]
        lead = self.runs[0]
        # Its own generator: creating a loader must not draw from the global RNG.
        return DataLoader(lead.built.train_ds, batch_sampler=batches, collate_fn=default_collate,
                          num_workers=lead.config.train.num_workers,
                          generator=torch.Generator().manual_seed(lead.config.train.seed))

    def _after_step(self, stop: int) -> None:
        """The records, validation and checkpoints due after the step just taken."""
        lead = self.runs[0]
        cfg, at, total = lead.config.train, lead.step, lead.built.total_steps
        if at % cfg.log_every == 0 or at == total:
            for run in self.runs:
                run.writer.record(run.log)
                run.smoother.recorded()
        if cfg.eval_every and at % cfg.eval_every == 0 and lead.built.val_ds is not None \
                and at < total:
            self.evaluate()
        if at == total and not self.final_checkpoint:
            return  # the weights are not kept: the summary follows, then nothing to resume
        if at == stop or self.checkpoints.due(at):
            self.checkpoint()
            check_stop(at)  # a stop requested (crl.train.stop) ends the runs here

    def _stopped(self, exc: NonFiniteLossError) -> NonFiniteLossError:
        lead = self.runs[0]
        if lead.last_checkpoint is None:
            where = "no checkpoint was written yet"
        elif len(self.runs) == 1:
            where = (f"the last good checkpoint is {lead.writer.run_dir / CHECKPOINT_FILE} at "
                     f"step {lead.last_checkpoint}")
        else:
            where = (f"the last good checkpoints ({CHECKPOINT_FILE} of each run) are at step "
                     f"{lead.last_checkpoint}")
        return NonFiniteLossError(f"{exc}; stopped without saving the weights; {where} (lower "
                                  "optim.lr, set optim.grad_clip, or raise loss.temperature)")

    def evaluate(self) -> list[dict[str, float]]:
        """Every run's validation metrics, recorded (rank 0; ``{}`` on the others and for a
        run without a validation split)."""
        out = []
        with shared_inputs(self.runs):
            for run in self.runs:
                with run.rng:
                    val = run.built.val_ds
                    with run.spent.measure():
                        out.append({} if val is None else run.evaluate(val, "val"))
        return out

    def checkpoint(self) -> None:
        """Every run's ``checkpoint.pt``, written under the run's RNG context (the RNG state
        it stores is the run's own)."""
        for run in self.runs:
            with run.rng, run.spent.measure():
                run.checkpoint()
        self.checkpoints.restart()

    def finish(self, clock: Stopwatch) -> list[RunResult]:
        """Every run's final evaluation, then each run's ``summary.json`` with its time
        (:func:`~crl.train.timing.time_fields`: ``clock`` started with the training; in a
        group, a run's share), :meth:`TrainingRun.finish`."""
        summaries = []
        with shared_inputs(self.runs):
            for run in self.runs:
                with run.rng, run.spent.measure():
                    summaries.append(run.final_summary())
        times = time_fields(clock.elapsed(), [run.spent for run in self.runs])
        results = []
        for run, summary, spent in zip(self.runs, summaries, times, strict=True):
            with run.rng:
                results.append(run.finish({**summary, **spent}))
        return results


def _lockstep(run: TrainingRun) -> dict[str, Any]:
    """What runs trained together must share: what makes their batches and their schedule."""
    cfg = run.config
    return {"data": cfg.data, "train.seed": cfg.train.seed,
            "train.batch_size": cfg.train.batch_size, "train.sampler": cfg.train.sampler,
            "schedule": (run.built.total_steps, run.built.steps_per_epoch)}


__all__ = ["RunResult", "Trainer", "TrainingRun", "open_run"]
