"""The typed run config (``TrainConfig``), its loading from YAML or a preset, and ``--set``.

Every section takes its defaults here (or in its own package for ``data``, ``model`` and
``negatives``) and nowhere else; unknown keys are errors that list the valid ones, and all the
problems of a file are reported together in one :class:`~crl.errors.CrlValueError`.

Example:
    >>> cfg = load_config("synthetic-gaussian", ["train.steps=50", "loss.temperature=0.2"])
    >>> cfg.train.steps, cfg.loss.temperature, cfg.train.total_steps(num_train=100)
    (50, 0.2, 50)
"""

from __future__ import annotations

import email
import hashlib
import json
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from crl.data.config import DataConfig
from crl.errors import CrlValueError
from crl.models.config import ModelConfig
from crl.negatives.config import NegativesConfig

LossName = Literal["info_nce", "clip", "siglip", "supcon", "gcl", "oce", "pairwise"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GclOptions(_Section):
    """Options of the global contrastive loss (THEORY.md section 3).

    Attributes:
        gamma: Moving-average weight of the new estimate of ``u`` (constant schedule).
        gamma_schedule: ``"constant"`` or ``"cosine"`` (1 down to ``gamma_min`` over
            ``decay_epochs``, default: the run's epochs).
        gamma_min: Final gamma of the cosine schedule.
        decay_epochs: Epochs of the cosine decay (None: the number of epochs of the run).
        temperature_mode: ``"fixed"``, ``"global_learnable"`` or ``"per_sample"``.
        rho: The KL-radius term of the learnable-temperature objective.
    """

    gamma: float = Field(0.9, gt=0, le=1)
    gamma_schedule: Literal["constant", "cosine"] = "constant"
    gamma_min: float = Field(0.2, gt=0, le=1)
    decay_epochs: int | None = Field(None, ge=1)
    temperature_mode: Literal["fixed", "global_learnable", "per_sample"] = "fixed"
    rho: float = 6.5


class OceOptions(_Section):
    """The OCE risk's ``phi`` (``"kl"`` uses ``loss.temperature``) and CVaR's ``alpha``."""

    phi: Literal["kl", "cvar", "softplus"] = "kl"
    alpha: float = Field(0.1, gt=0, le=1)


class LossConfig(_Section):
    """The ``loss`` section: which contrastive loss, and its hyperparameters.

    Attributes:
        name: ``info_nce`` (NT-Xent / InfoNCE at a fixed temperature), ``clip`` (the model's
            learnable ``logit_scale``), ``siglip`` (its own learnable scale and bias), ``supcon``
            (labels, or the two views of an index, as positives), ``gcl``, ``oce``, ``pairwise``.
        temperature: ``tau`` of info_nce, supcon, gcl, oce (``phi="kl"``) and of the held-out
            contrastive risk.
        symmetric: Average the ``a -> b`` and ``b -> a`` directions.
        learnable_scale: Train SigLIP's scale and bias (False: keep the initial values); CLIP's
            ``logit_scale`` follows ``model.learn_logit_scale``.
        gcl: GCL options.
        oce: OCE options.
        pairwise_loss: The surrogate of ``pairwise``.
        kmeans_weight: Weight of the relaxed k-means regulariser (0: off).
        kmeans_k: Its number of clusters (None: the data's number of classes, else 10).
        block_size: Compute ``info_nce``, ``clip`` and ``gcl`` exactly over tiles of this side
            (memory ``O(B·D + T²)`` instead of ``B²``; the same values and gradients). For
            ``info_nce``/``clip`` it applies with in-batch negatives; ``gcl`` also asks negative
            sets tile by tile. None: the plain path (tiles only above B = 2048).
    """

    name: LossName = "info_nce"
    temperature: float = Field(0.1, gt=0)
    symmetric: bool = True
    learnable_scale: bool = True
    gcl: GclOptions = Field(default_factory=GclOptions)
    oce: OceOptions = Field(default_factory=OceOptions)
    pairwise_loss: Literal["logistic", "exponential", "squared_hinge", "hinge"] = "logistic"
    kmeans_weight: float = Field(0.0, ge=0)
    kmeans_k: int | None = Field(None, ge=1)
    block_size: int | None = Field(None, ge=1)


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
        device: ``cpu`` or ``cuda`` (``cuda:N``).
        num_workers: DataLoader worker processes (0: in the main process).
        num_threads: torch intra-op threads during the run (None: torch's default). On a
            shared or busy machine 1 is often fastest for small models.
    """

    seed: int = Field(0, ge=0)
    batch_size: int = Field(256, ge=2)
    epochs: int | None = Field(None, ge=1)
    steps: int | None = Field(None, ge=1)
    max_samples: int | None = Field(None, ge=1)
    log_every: int = Field(10, ge=1)
    eval_every: int | None = Field(None, ge=1)
    checkpoint_every: int | None = Field(None, ge=1)
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$")
    num_workers: int = Field(0, ge=0)
    num_threads: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one_budget(self) -> TrainOptions:
        given = [k for k in ("epochs", "steps", "max_samples") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(
                "give exactly one of epochs / steps / max_samples; got "
                + ", ".join(f"{k}={getattr(self, k)}" for k in given)
            )
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
        if self.loss.name in ("supcon", "siglip") and self.negatives.regime != "in_batch":
            raise ValueError(
                f"loss {self.loss.name!r} contrasts every batch member; negatives.regime must "
                f"be 'in_batch'; got {self.negatives.regime!r}"
            )
        return self


def config_hash(config: TrainConfig) -> str:
    """A short (8 hex digits) hash of the resolved config: the run id.

    Example:
        >>> config_hash(TrainConfig()) == config_hash(TrainConfig())
        True
    """
    text = json.dumps(config.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


# ---------------------------------------------------------------------------- loading


def preset_names() -> list[str]:
    """Names of the shipped presets (``crl train <name>``)."""
    folder = resources.files("crl.train") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _read_source(path_or_preset: str | Path) -> tuple[dict[str, Any], str]:
    path = Path(path_or_preset)
    if path.is_file():
        text, origin = path.read_text(encoding="utf-8"), str(path)
    elif str(path_or_preset) in preset_names():
        resource = resources.files("crl.train") / "presets" / f"{path_or_preset}.yaml"
        text, origin = resource.read_text(encoding="utf-8"), f"preset {path_or_preset!r}"
    else:
        raise CrlValueError(
            f"load_config: CONFIG must be a YAML file or a preset name; got {str(path_or_preset)!r}"
            f" (no such file; presets: {', '.join(preset_names())})"
        )
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CrlValueError(f"{origin}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CrlValueError(f"{origin}: the top level must be a mapping of sections; "
                            f"got {type(data).__name__}")
    return data, origin


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``--set a.b=c`` overrides to a nested dict (values parsed as YAML scalars).

    Example:
        >>> apply_overrides({"train": {"steps": 10}}, ["train.steps=20", "loss.name=clip"])
        {'train': {'steps': 20}, 'loss': {'name': 'clip'}}
    """
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise CrlValueError(f"--set: expected KEY=VALUE with a dotted KEY such as "
                                f"train.steps=100; got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise CrlValueError(f"--set {item!r}: {'.'.join(parts[:depth + 1])} is a value, "
                                    f"not a section; got {child!r}")
            node = child
        node[parts[-1]] = value
    return data


def _model_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The config class at a location, to list its valid keys."""
    cls: type[BaseModel] = TrainConfig
    for part in loc:
        field = cls.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        cls = annotation
    return cls


def format_validation_error(exc: ValidationError, origin: str) -> str:
    """All errors of a config, one line each, naming the dotted key."""
    lines = []
    for err in exc.errors():
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        key = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            parent = _model_at(loc[:-1])
            valid = ", ".join(parent.model_fields) if parent is not None else "?"
            lines.append(f"  {key}: unknown key; valid keys here: {valid}")
        else:
            message = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = "" if isinstance(got, dict) else f"; got {got!r}"
            lines.append(f"  {key}: {message}{shown}")
    return f"{origin}: {len(lines)} error(s) in the config:\n" + "\n".join(lines)


def validate_config(data: dict[str, Any], origin: str = "config") -> TrainConfig:
    """Validate a nested dict into a :class:`TrainConfig`, reporting every error together."""
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise CrlValueError(format_validation_error(exc, origin)) from None


def load_config(path_or_preset: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Load a run config from a YAML file or a shipped preset, then apply ``--set`` overrides.

    Args:
        path_or_preset: A YAML file, or a preset name (see :func:`preset_names`).
        overrides: ``"a.b=c"`` strings; values are parsed as YAML scalars (``1e-3``, ``true``,
            ``[1, 5]``, ``null``).

    Returns:
        The validated config.

    Raises:
        CrlValueError: listing every problem (unknown keys with the valid ones, bad values).
    """
    data, origin = _read_source(path_or_preset)
    return validate_config(apply_overrides(data, overrides), origin)


def smoke(config: TrainConfig) -> TrainConfig:
    """A copy of ``config`` shrunk to run in seconds: 20 steps of batches of at most 32, at most
    256 training pairs (digits, synthetic), and (pycode) only the standard library's ``email``
    package mined.

    Example:
        >>> smoke(load_config("digits-simclr")).train.steps
        20
    """
    data = config.model_dump()
    train = data["train"]
    batch = min(config.train.batch_size, 32)
    train.update(batch_size=batch, steps=20, epochs=None, max_samples=None, log_every=5,
                 eval_every=10, checkpoint_every=10)
    data["optim"]["warmup_steps"] = min(config.optim.warmup_steps, 5)
    if config.data.name in ("digits", "synthetic"):  # sizes known to exceed 256
        data["data"]["num_train"] = min(config.data.num_train or 256, 256)
    data["data"]["synthetic"]["num_samples"] = min(config.data.synthetic.num_samples, 512)
    data["eval"]["batch_size"] = min(config.eval.batch_size, 256)
    if config.data.name == "pycode" and config.data.pycode.roots is None:
        # Mine one small standard-library package instead of the whole installation.
        data["data"]["pycode"]["roots"] = [str(Path(email.__file__).parent)]
    if config.loss.gcl.decay_epochs is not None:
        data["loss"]["gcl"]["decay_epochs"] = 1
    return validate_config(data, "smoke config")

__all__ = [
    "EvalConfig",
    "GclOptions",
    "LossConfig",
    "OceOptions",
    "OptimConfig",
    "TrainConfig",
    "TrainOptions",
    "apply_overrides",
    "config_hash",
    "load_config",
    "preset_names",
    "smoke",
    "validate_config",
]
