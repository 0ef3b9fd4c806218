"""``build_model(cfg, info)``: the dual encoder a model config describes, for the given data."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn

from crl.data.base import DataInfo
from crl.errors import CrlValueError
from crl.models.config import ModelConfig
from crl.models.dual import DualEncoder, TextFeaturizer
from crl.models.towers import SmallCNN, Tower, mlp, projection_head

_KINDS_BY_DATA = {
    "vector": ("linear", "mlp", "custom"),
    "image": ("linear", "mlp", "cnn", "custom"),
    "text": ("frozen_minilm", "embedding_bag", "transformer", "custom"),
}
_DEFAULT_KIND = {"vector": "mlp", "image": "cnn", "text": "embedding_bag"}


def resolve_kind(cfg: ModelConfig, info: DataInfo) -> str:
    """The model kind ``cfg`` asks for on data ``info`` (``auto`` resolved), checked to fit."""
    kind = _DEFAULT_KIND[info.kind] if cfg.kind == "auto" else cfg.kind
    if kind not in _KINDS_BY_DATA[info.kind]:
        raise CrlValueError(
            f"build_model: model kind {kind!r} does not take {info.kind} data ({info.name!r}); "
            f"valid kinds for it: " + ", ".join(repr(k) for k in _KINDS_BY_DATA[info.kind])
        )
    if cfg.sparse and kind != "embedding_bag":
        picked = f" (what 'auto' picks for {info.kind} data)" if cfg.kind == "auto" else ""
        raise CrlValueError(f"build_model: model.sparse must be false for model kind {kind!r}"
                            f"{picked}: only 'embedding_bag' has a token table with sparse "
                            "gradients")
    return kind


def _input_dims(info: DataInfo) -> tuple[int, int]:
    if info.kind == "image":
        assert info.image_shape is not None
        d = math.prod(info.image_shape)
        return d, d
    if info.dim_a is None or info.dim_b is None:
        raise CrlValueError(f"build_model: vector data {info.name!r} must give dim_a and dim_b")
    return info.dim_a, info.dim_b


def _tower_factory(kind: str, cfg: ModelConfig, info: DataInfo) -> Callable[[int], nn.Module]:
    """A function from the input dimension of a view to a fresh tower."""
    head, embed_dim = cfg.resolved_head(), cfg.resolved_embed_dim()
    if kind == "linear":
        return lambda d: Tower(nn.Sequential(nn.Flatten(), nn.Linear(d, embed_dim)))
    if kind == "mlp":
        return lambda d: Tower(nn.Sequential(
            nn.Flatten(), mlp(d, cfg.hidden_dim, embed_dim, cfg.num_layers)))
    if kind == "cnn":
        assert info.image_shape is not None
        shape = info.image_shape
        return lambda d: Tower(
            SmallCNN(shape, cfg.cnn_channels, cfg.hidden_dim),
            projection_head(head, cfg.hidden_dim, cfg.hidden_dim, embed_dim,
                            cfg.num_layers),
        )
    if kind == "frozen_minilm":
        from crl.models.text import MINILM_DIM

        if head == "none" and embed_dim != MINILM_DIM:
            raise CrlValueError(
                f"build_model: 'frozen_minilm' with head 'none' outputs MiniLM's {MINILM_DIM}-d "
                f"features; set embed_dim={MINILM_DIM} (got {embed_dim}) or choose a head"
            )
        return lambda d: Tower(nn.Identity(), projection_head(
            head, MINILM_DIM, cfg.hidden_dim, embed_dim, cfg.num_layers))
    from crl.models.bag import EmbeddingBagEncoder

    if head == "none" and embed_dim != cfg.token_dim:
        raise CrlValueError(
            f"build_model: 'embedding_bag' with head 'none' outputs token_dim={cfg.token_dim} "
            f"features; set embed_dim={cfg.token_dim} (got {embed_dim}) or choose a head"
        )
    return lambda vocab: Tower(
        EmbeddingBagEncoder(vocab, cfg.token_dim, cfg.bigram_buckets, sparse=cfg.sparse),
        projection_head(head, cfg.token_dim, cfg.hidden_dim, embed_dim, cfg.num_layers),
    )


def _text_featurizer(kind: str, cfg: ModelConfig) -> tuple[TextFeaturizer, int]:
    """The featurizer of a text model and the input size its towers are built for."""
    if kind == "frozen_minilm":
        from crl.models.text import FrozenTextEncoder

        encoder = FrozenTextEncoder(cache_dir=cfg.cache_dir, batch_size=cfg.text_batch_size)
        return encoder.encode, encoder.dim
    from crl.models.tokenizer import MiniLMTokenizer

    tokenizer = MiniLMTokenizer(cfg.max_tokens, cache_dir=cfg.cache_dir)
    return tokenizer, tokenizer.vocab_size


def build_model(cfg: ModelConfig, info: DataInfo) -> DualEncoder:
    """The dual encoder of ``cfg`` for data described by ``info``.

    Parameters are initialised from torch's global RNG (seed it first for reproducible runs).

    Args:
        cfg: The model section of a run config.
        info: What the data looks like (``load_data(...).info``).

    Returns:
        A :class:`DualEncoder`; for text data its ``prepare`` turns data sets into tensors.

    Raises:
        CrlValueError: if the kind does not fit the data, or a shared tower is asked for two
            views of different dimensions.

    Example:
        >>> import torch
        >>> from crl.data import DataInfo
        >>> info = DataInfo("image", None, None, (1, 8, 8), 10, "digits")
        >>> model = build_model(ModelConfig(embed_dim=32), info)
        >>> model.shared, model.encode_a(torch.zeros(3, 1, 8, 8)).shape
        (True, torch.Size([3, 32]))
    """
    kind = resolve_kind(cfg, info)
    featurizer: TextFeaturizer | None = None
    if kind == "custom":
        from crl.models.custom import custom_towers

        tower_a, tower_b, featurizer = custom_towers(cfg, info)
    elif kind == "transformer":
        from crl.models.transformer import transformer_towers

        tower_a, tower_b, featurizer = transformer_towers(cfg)
    else:
        tower_a, tower_b, featurizer = _own_towers(kind, cfg, info)
    return DualEncoder(tower_a, tower_b, normalize=cfg.normalize, text_featurizer=featurizer)


def _own_towers(kind: str, cfg: ModelConfig,
                info: DataInfo) -> tuple[nn.Module, nn.Module, TextFeaturizer | None]:
    # One tower by default for two views of an image, and for bags of tokens: docstrings and
    # code share words, and a shared embedding table learns from both sides (on pycode stdlib
    # pairs it reached recall@1 0.30 where two separate tables reached 0.08; docs/data.md).
    default_shared = info.kind == "image" or kind == "embedding_bag"
    shared = cfg.shared_tower if cfg.shared_tower is not None else default_shared
    featurizer: TextFeaturizer | None = None
    if info.kind == "text":
        featurizer, size = _text_featurizer(kind, cfg)
        dim_a = dim_b = size
    else:
        dim_a, dim_b = _input_dims(info)
    if shared and dim_a != dim_b:
        raise CrlValueError(
            f"build_model: a shared tower needs views of the same dimension; got dim_a={dim_a} "
            f"and dim_b={dim_b} (set shared_tower=False)"
        )
    make = _tower_factory(kind, cfg, info)
    tower_a = make(dim_a)
    tower_b = tower_a if shared else make(dim_b)
    return tower_a, tower_b, featurizer
