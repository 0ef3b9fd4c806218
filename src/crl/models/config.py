"""Typed configuration of the encoders (the ``model`` section of a run config).

Example:
    >>> cfg = ModelConfig(kind="mlp", embed_dim=64)
    >>> cfg.hidden_dim, cfg.normalize, round(cfg.init_logit_scale, 4)
    (256, True, 2.6593)
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ModelKind = Literal["auto", "linear", "mlp", "cnn", "frozen_minilm", "embedding_bag"]


class ModelConfig(BaseModel):
    """Which encoder towers, and how their outputs are scored.

    Attributes:
        kind: ``linear`` or ``mlp`` (vectors, or flattened images); ``cnn`` (images);
            ``frozen_minilm`` (text: trainable heads over frozen all-MiniLM-L6-v2 features);
            ``embedding_bag`` (text: a bag of MiniLM tokenizer ids, and hashed bigrams, trained
            from scratch); ``auto``: ``mlp`` for vectors, ``cnn`` for images, ``embedding_bag``
            for text.
        embed_dim: Output dimension ``D`` of both towers.
        hidden_dim: Width of hidden layers (and of the CNN's representation).
        num_layers: Hidden layers of ``mlp`` towers and of ``mlp`` heads.
        head: Projection head after the backbone of ``cnn``, ``frozen_minilm`` and
            ``embedding_bag`` towers: ``none`` (``frozen_minilm`` then needs ``embed_dim=384``
            and gives the zero-shot MiniLM baseline), ``linear``, ``mlp`` or ``residual``
            (``x + W x`` with ``W`` initialised at zero, so training starts from the backbone's
            similarities; needs ``embed_dim`` equal to the backbone width, 384 for MiniLM).
        shared_tower: One tower for both views (SimCLR-style); None: True for images and for
            ``embedding_bag`` text towers, else False.
        normalize: L2-normalise the outputs.
        init_logit_scale: Initial ``log(1/tau)`` (CLIP: ``log(1/0.07)``).
        learn_logit_scale: Train ``logit_scale`` (else it stays at its initial value).
        max_logit_scale: ``clamp_logit_scale_`` keeps ``exp(logit_scale) <= max_logit_scale``.
        cnn_channels: Channels of the CNN's convolution layers.
        token_dim: Width of the ``embedding_bag`` token embeddings.
        max_tokens: Tokens kept per text by ``embedding_bag``.
        bigram_buckets: Hash buckets for token bigrams in ``embedding_bag`` (0: unigrams only).
        text_batch_size: Batch size of the frozen MiniLM encoder.
        cache_dir: Cache of MiniLM features (None: ``$CRL_CACHE_DIR`` or ``~/.cache/crl``).
    """

    model_config = ConfigDict(extra="forbid")

    kind: ModelKind = "auto"
    embed_dim: int = Field(128, ge=1)
    hidden_dim: int = Field(256, ge=1)
    num_layers: int = Field(2, ge=1)
    head: Literal["none", "linear", "mlp", "residual"] = "mlp"
    shared_tower: bool | None = None
    normalize: bool = True
    init_logit_scale: float = math.log(1 / 0.07)
    learn_logit_scale: bool = True
    max_logit_scale: float = Field(100.0, gt=0)
    cnn_channels: list[int] = Field(default_factory=lambda: [32, 64], min_length=1)
    token_dim: int = Field(128, ge=1)
    max_tokens: int = Field(128, ge=1)
    bigram_buckets: int = Field(0, ge=0)
    text_batch_size: int = Field(64, ge=1)
    cache_dir: str | None = None
