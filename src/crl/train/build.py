"""What a run is made of, built from its config: data, model, objective, optimiser, schedule.

:func:`build_run` is shared by training (:func:`crl.train.fit`), re-evaluation
(:func:`crl.train.evaluate_run`) and the studies, so all of them see the same model and objective
for a config.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim import SGD, Optimizer

from crl import distributed, losses
from crl.data import load_data
from crl.errors import CrlValueError
from crl.losses import LogitScaleInit, Objective
from crl.losses.config import GuideOptions
from crl.losses.guide import FalseNegativeGuide, GuideEmbeddings
from crl.models import DualEncoder, build_model
from crl.train.config import OptimConfig, TrainConfig
from crl.train.lazy_adamw import LazyAdamW


def seed_everything(seed: int) -> None:
    """Seed torch, numpy and python's RNGs."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (code that uses the global RNG)
    random.seed(seed)


def build_optimizer(cfg: OptimConfig, params: list[nn.Parameter], *,
                    sparse: Collection[nn.Parameter] = ()) -> Optimizer:
    """AdamW or SGD over ``params``. AdamW is :class:`~crl.train.lazy_adamw.LazyAdamW`: row-wise
    where a gradient is sparse, torch's AdamW kernel where it is dense.

    Both use torch's multi-tensor (``foreach``) update, which torch picks by default only on
    CUDA: on CPU it gives the same values bit for bit as the per-tensor loop (a test compares
    them) without a temporary per parameter for ``sqrt(v)``, which for a large embedding table
    is most of the optimiser's time (benchmarks/steps.py). AdamW's multi-tensor calls take at
    most :data:`~crl.train.lazy_adamw.FOREACH_MAX_ELEMENTS` values at a time, so their
    temporaries do not add a copy of a large model at its peak (benchmarks/gradcache.py).

    Args:
        cfg: The ``optim`` section.
        params: The parameters to train (:func:`trainable`).
        sparse: Those of ``params`` whose gradients are sparse (:func:`sparse_parameters`: the
            tables of a ``model.sparse`` embedding bag). If any, one LazyAdamW updates them
            row-wise and the others with torch's AdamW kernel, under one learning rate
            (docs/training.md, section "Sparse embedding gradients").

    Raises:
        CrlValueError: for sparse parameters with an optimiser other than ``adamw``, or under
            torchrun (sparse gradients are not all-reduced).
    """
    if sparse:
        if cfg.name != "adamw":
            raise CrlValueError(f"model.sparse=True needs optim.name='adamw' (its row-wise lazy "
                                f"twin); got optim.name={cfg.name!r}; set model.sparse=false")
        if distributed.is_active() and distributed.world_size() > 1:
            raise CrlValueError("model.sparse=True does not run under torchrun (sparse "
                                "gradients are not averaged over ranks); set model.sparse=false")
    if cfg.name == "adamw":
        return LazyAdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    return SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
               foreach=True)


def sparse_parameters(modules: list[nn.Module]) -> list[nn.Parameter]:
    """The trainable tables of the ``nn.Embedding`` and ``nn.EmbeddingBag`` layers of
    ``modules`` built with ``sparse=True`` (their gradients are sparse), each once, in order.

    Example:
        >>> bag = nn.EmbeddingBag(10, 4, sparse=True)
        >>> sparse_parameters([nn.Sequential(bag, nn.Linear(4, 2))]) == [bag.weight]
        True
    """
    tables = [m.weight for module in modules for m in module.modules()
              if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse]
    return [p for p in trainable(modules) if any(p is t for t in tables)]


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


def trainable(modules: list[nn.Module]) -> list[nn.Parameter]:
    """The parameters of ``modules`` that require a gradient, each once, in order."""
    seen: set[int] = set()
    params = []
    for module in modules:
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def run_objective(config: TrainConfig, *, num_samples: int, labels: Tensor | None,
                  epochs: int, num_classes: int | None,
                  guide: FalseNegativeGuide | None = None) -> Objective:
    """:func:`crl.losses.build_objective` of a run config: its ``loss`` and ``negatives``
    sections, with the ``model`` section's logit-scale settings (CLIP's scale lives in the
    objective), whether it L2-normalises (Matryoshka prefixes are normalised again) and the
    guide of ``loss.guide`` (:func:`build_guide`)."""
    return losses.build_objective(config.loss, config.negatives, num_samples=num_samples,
                                  labels=labels, epochs=epochs, num_classes=num_classes,
                                  logit_scale=LogitScaleInit.of(config.model),
                                  normalized=config.model.normalize, guide=guide)


def build_guide(cfg: GuideOptions, train: Any, *, device: torch.device,
                cache_dir: str | None = None) -> FalseNegativeGuide:
    """The guide of ``loss.guide`` over the training pairs ``train`` (a text data set): its
    model embeds the anchors, positives and hard negatives once, without gradient, at the first
    training step (:class:`crl.losses.guide.FalseNegativeGuide`).

    Raises:
        CrlValueError: for data that is not text, or a ``model`` that names no encoder.
    """
    from crl.eval.encoder import encoder_kind, load_encoder

    if not train.is_text:
        raise CrlValueError("loss.guide needs text pairs (its model scores texts); the data "
                            f"gives {type(train).__name__}; remove loss.guide")
    encoder_kind(cfg.model, where="loss.guide.model")  # a bad path fails now, not at step 1

    def embed() -> GuideEmbeddings:
        encoder = load_encoder(cfg.model, where="loss.guide.model", device=str(device),
                               batch_size=cfg.batch_size, cache_dir=cache_dir)
        with torch.no_grad():
            a, b = encoder.encode_queries(train.a), encoder.encode_documents(train.b)
            rows = train.hard_negative_views()
            hard = None if rows is None else encoder.encode_documents(
                [t for row in rows for t in row]).reshape(len(rows), len(rows[0]), -1)
        return GuideEmbeddings(a, b, hard)  # (N, D_g), (N, D_g), (N, H, D_g)

    return FalseNegativeGuide(embed, margin=cfg.margin, strategy=cfg.margin_strategy)


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


def _check_prefixes(dims: list[int], model: DualEncoder, train_ds: Any,
                    device: torch.device) -> None:
    """``loss.matryoshka.dims`` against the embedding dimension (one pair encoded, in eval
    mode), before anything is trained or written."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            width = int(model.encode_a(train_ds.eval_views()[0][:1].to(device)).shape[-1])
    finally:
        model.train(was_training)
    if max(dims) > width:
        raise CrlValueError(f"loss.matryoshka.dims must be at most the embedding dimension "
                            f"D = {width}; got {dims}")


def build_run(config: TrainConfig, device: torch.device) -> BuiltRun:
    """Load the data, build the model (seeded by ``train.seed``) and the objective.

    Raises:
        CrlValueError: if the batch is larger than the training split.
    """
    seed_everything(config.train.seed)
    splits = load_data(config.data)
    guide = None if config.loss.guide is None else build_guide(
        config.loss.guide, splits.train, device=device, cache_dir=config.model.cache_dir)
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
    if config.loss.matryoshka is not None:
        _check_prefixes(config.loss.matryoshka.dims, model, train_ds, device)
    objective = run_objective(config, num_samples=n, labels=train_ds.labels,
                              epochs=math.ceil(total / per_epoch),
                              num_classes=splits.info.num_classes, guide=guide).to(device)
    return BuiltRun(splits, model, objective, train_ds, val_ds, test_ds, per_epoch, total)


__all__ = [
    "BuiltRun",
    "build_guide",
    "build_optimizer",
    "build_run",
    "lr_factor",
    "run_objective",
    "seed_everything",
    "sparse_parameters",
    "trainable",
]
