"""The typed run config (``TrainConfig``) and its hash, the run id.

Every section takes its defaults here (or in its own package for ``data``, ``model`` and
``negatives``) and nowhere else; unknown keys are errors that list the valid ones. Loading from
YAML or a preset, ``--set`` and validation live in :mod:`crl.train.loading`.

Example:
    >>> cfg = TrainConfig.model_validate({"train": {"steps": 50}})
    >>> cfg.train.steps, cfg.train.total_steps(num_train=100)
    (50, 50)
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from crl.data.config import DataConfig
from crl.losses.config import GclOptions, LossConfig, OceOptions
from crl.losses.registry import OBJECTIVES
from crl.models.config import ModelConfig
from crl.negatives.config import NegativesConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class OptimConfig(_Section):
    """The ``optim`` section: optimiser and learning-rate schedule.

    Attributes:
        name: ``adamw`` or ``sgd`` (with ``momentum``, Nesterov off).
        lr: Peak learning rate.
        weight_decay: Decoupled (AdamW) or L2 (SGD) weight decay.
        momentum: SGD momentum.
        betas: AdamW betas.
        warmup_steps: Linear warm-up from 0 to ``lr``.
        schedule: ``cosine`` (to ``min_lr_ratio * lr`` at the last step) or ``constant``.
        min_lr_ratio: Final learning rate of the cosine schedule, as a fraction of ``lr``.
        grad_clip: Clip the global gradient norm to this value (None: no clipping).
    """

    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    grad_clip: float | None = Field(None, gt=0)


class TrainOptions(_Section):
    """The ``train`` section: budget, batch, seed, intervals and device.

    At most one of ``epochs`` / ``steps`` / ``max_samples`` may be given; with none,
    ``steps = 1000``. ``max_samples`` is a budget of processed samples (``steps =
    ceil(max_samples / batch_size)``), as in the negatives study. Batches are full (the last
    partial batch of an epoch is dropped).

    Attributes:
        seed: Seeds the model initialisation, the data order and the global RNGs.
        batch_size: Pairs per step.
        epochs, steps, max_samples: The budget.
        log_every: Steps between ``train/loss`` records.
        eval_every: Steps between validation evaluations (None: only at the end).
        checkpoint_every: Steps between checkpoints (None: only at the end).
        checkpoint_every_s: Seconds between checkpoints (None: not by time): a checkpoint is
            written once this long has passed since the last one (or since training started),
            on a monotonic clock, and right after the step under way when a stop is requested
            (:mod:`crl.train.stop`). With ``checkpoint_every``, whichever is due first; either
            way there is one at the last step.
        device: ``cpu`` or ``cuda`` (``cuda:N``).
        num_workers: DataLoader worker processes (0: in the main process).
        num_threads: torch intra-op threads during the run (None: torch's default). On a
            shared or busy machine 1 is often fastest for small models.
        sampler: The epoch's batch order: ``random`` (a seeded permutation cut into batches) or
            ``no_duplicates`` (the same order, but two pairs with an identical ``a`` or ``b``
            text, or identical tensors, never share a batch; docs/training.md).
        micro_batch_size: Gradient caching: embed each (per-rank) batch in micro-batches of
            this many pairs and back-propagate the loss's cached embedding gradients through
            them, so activation memory is set by it, not by ``batch_size``; the loss and the
            gradients are those of the whole batch (docs/training.md). None: one pass.
        micro_batch_tokens: Gradient caching with micro-batches packed by tokens: each view's
            texts sorted by length and cut into micro-batches of at most this many padded
            tokens (at most ``micro_batch_size`` texts when both are given); token inputs only
            (``model.kind: transformer``; docs/training.md). None: by count.
        precision: ``fp32``, or ``bf16`` (the towers run under bfloat16 autocast on CPU and
            CUDA; the loss and the logit scale stay float32).
    """

    seed: int = Field(0, ge=0)
    batch_size: int = Field(256, ge=2)
    epochs: int | None = Field(None, ge=1)
    steps: int | None = Field(None, ge=1)
    max_samples: int | None = Field(None, ge=1)
    log_every: int = Field(10, ge=1)
    eval_every: int | None = Field(None, ge=1)
    checkpoint_every: int | None = Field(None, ge=1)
    checkpoint_every_s: float | None = Field(None, gt=0)
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$")
    num_workers: int = Field(0, ge=0)
    num_threads: int | None = Field(None, ge=1)
    sampler: Literal["random", "no_duplicates"] = "random"
    micro_batch_size: int | None = Field(None, ge=1)
    micro_batch_tokens: int | None = Field(None, ge=1)
    precision: Literal["fp32", "bf16"] = "fp32"

    @model_validator(mode="after")
    def _one_budget(self) -> TrainOptions:
        given = [k for k in ("epochs", "steps", "max_samples") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(
                "give exactly one of epochs / steps / max_samples; got "
                + ", ".join(f"{k}={getattr(self, k)}" for k in given)
            )
        if self.micro_batch_size is not None and self.micro_batch_size > self.batch_size:
            raise ValueError(f"micro_batch_size must be at most batch_size = {self.batch_size}; "
                             f"got {self.micro_batch_size}")
        return self

    def total_steps(self, num_train: int) -> int:
        """The number of optimiser steps for a training split of ``num_train`` pairs."""
        if self.epochs is not None:
            return self.epochs * self.steps_per_epoch(num_train)
        if self.max_samples is not None:
            return math.ceil(self.max_samples / self.batch_size)
        return self.steps if self.steps is not None else 1000

    def steps_per_epoch(self, num_train: int) -> int:
        """Full batches per epoch (at least 1 when ``num_train >= batch_size``)."""
        return num_train // self.batch_size


class EvalConfig(_Section):
    """The ``eval`` section: what is measured on the validation and test splits.

    Attributes:
        ks: Cut-offs of ``recall@k``.
        retrieval: Retrieval metrics on the paired eval views.
        probe: Linear probe and kNN (labelled data only; trained on the train split).
        geometry: Alignment and uniformity.
        risk: Held-out contrastive risk at the loss temperature, all other items as negatives.
        probe_features: ``representation`` (before the projection head, as SimCLR probes) or
            ``embedding`` (the model's output).
        knn_k: Neighbours of the kNN probe.
        batch_size: Items encoded at once.
        block_size: Query rows scored at once in retrieval metrics.
        hard_negatives: Each query's hard negatives (data with hard-negative columns) are
            extra candidates in the ``x2y`` retrieval metrics (docs/data.md).
        ir: Also the IR metrics ``ir/{ndcg,mrr,map,recall,precision}@k`` at each of ``ks``,
            each pair's ``b`` the one relevant document of its ``a`` among the split's
            (docs/evaluation.md); a study's ``--metric ndcg@10`` turns it on.
    """

    ks: list[int] = Field(default_factory=lambda: [1, 5, 10])
    retrieval: bool = True
    probe: bool = True
    geometry: bool = True
    risk: bool = True
    probe_features: Literal["representation", "embedding"] = "representation"
    knn_k: int = Field(20, ge=1)
    batch_size: int = Field(1024, ge=1)
    block_size: int = Field(1024, ge=1)
    hard_negatives: bool = False
    ir: bool = False

    @model_validator(mode="after")
    def _check_ks(self) -> EvalConfig:
        if not self.ks or any(k < 1 for k in self.ks):
            raise ValueError(f"ks must be a non-empty list of integers >= 1; got {self.ks}")
        return self


class TrainConfig(_Section):
    """A full run: data, model, loss, negatives, optimiser, training loop and evaluation."""

    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    negatives: NegativesConfig = Field(default_factory=NegativesConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainOptions = Field(default_factory=TrainOptions)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @model_validator(mode="after")
    def _check_combinations(self) -> TrainConfig:
        accepts_sets = OBJECTIVES[self.loss.name].accepts_negative_sets  # SupCon, SigLIP: no
        if not accepts_sets and self.negatives.regime != "in_batch":
            raise ValueError(
                f"loss {self.loss.name!r} contrasts every batch member; negatives.regime must "
                f"be 'in_batch'; got {self.negatives.regime!r}"
            )
        if (self.train.micro_batch_tokens is not None
                and self.model.kind not in ("transformer", "custom")):
            raise ValueError(
                "train.micro_batch_tokens: needs token inputs (n, 2, L) of ids and attention "
                f"mask (model.kind: transformer); model.kind is {self.model.kind!r}; use "
                "train.micro_batch_size instead")
        if self.eval.hard_negatives and not (self.data.name == "files"
                                             and self.data.files.columns.negatives):
            raise ValueError("eval.hard_negatives needs hard negatives in the data: name their "
                             "columns in data.files.columns.negatives")
        return self


def stable_hash(data: Any, length: int = 10) -> str:
    """crl's one run-id hash: a short hex digest of ``data``'s canonical JSON (sorted keys,
    compact separators). It names ``crl train`` runs (:func:`config_hash`) and study runs.

    Example:
        >>> stable_hash({"b": 1, "a": [1, 2]}) == stable_hash({"a": [1, 2], "b": 1})
        True
    """
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def config_hash(config: TrainConfig) -> str:
    """A short (8 hex digits) :func:`stable_hash` of the resolved config: the run id.

    Example:
        >>> config_hash(TrainConfig()) == config_hash(TrainConfig())
        True
    """
    return stable_hash(config.model_dump(mode="json"), 8)


__all__ = [
    "EvalConfig",
    "GclOptions",
    "LossConfig",
    "OceOptions",
    "OptimConfig",
    "TrainConfig",
    "TrainOptions",
    "config_hash",
    "stable_hash",
]
