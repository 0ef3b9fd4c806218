"""Export a fine-tuned ``transformer`` tower as a sentence-transformers model directory.

The directory is built from sentence-transformers' own modules and written by its ``save``
(weights as safetensors): ``Transformer`` (the fine-tuned weights, the tokenizer and
``max_seq_length``), ``Pooling`` (``mean`` or ``cls``, as crl pooled), a ``Dense`` layer with
no activation for a ``linear`` head (a ``residual`` head ``x + W x + b`` becomes the linear map
``(I + W) x + b``), and ``Normalize`` when the model L2-normalises. ``SentenceTransformer(OUT)``
then loads it offline and gives the run's own embeddings (docs/data.md, "Export").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from crl.errors import CrlValueError
from crl.models.dual import DualEncoder
from crl.models.towers import ResidualLinear, Tower
from crl.models.transformer import TransformerEncoder, TransformerTokenizer

ExportFormat = Literal["sentence-transformers"]
FORMATS: tuple[str, ...] = ("sentence-transformers",)


def _dense(head: nn.Module) -> Any | None:
    """The sentence-transformers ``Dense`` module equal to ``head`` (None for the identity)."""
    from sentence_transformers.sentence_transformer.modules import Dense

    if isinstance(head, nn.Identity):
        return None
    if isinstance(head, ResidualLinear):
        linear = head.linear
        weight = linear.weight.detach() + torch.eye(linear.in_features)
    elif isinstance(head, nn.Linear):
        linear, weight = head, head.weight.detach()
    else:
        raise CrlValueError(
            f"export: a {type(head).__name__} projection head has no sentence-transformers "
            "module; train with model.head 'none', 'linear' or 'residual' to export"
        )
    bias = linear.bias.detach().clone() if linear.bias is not None else None
    return Dense(linear.in_features, linear.out_features, bias=bias is not None,
                 activation_function=nn.Identity(), init_weight=weight.clone(), init_bias=bias)


def sentence_transformer_modules(model: DualEncoder, *, tower: Literal["a", "b"] = "a",
                                 model_dir: Path) -> list[Any]:
    """The sentence-transformers modules that compute ``model.encode_<tower>`` on texts.

    Args:
        model: A dual encoder built by ``model.kind: transformer``.
        tower: Which tower to export (the same one for a shared tower).
        model_dir: The pretrained directory the tower was built from (its config and
            tokenizer files; the weights are replaced by the fine-tuned ones).

    Raises:
        CrlValueError: for a model that is not a transformer tower, or a head with no
            sentence-transformers equivalent (``mlp``).
    """
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    module = model.tower_a if tower == "a" else model.tower_b
    if not (isinstance(module, Tower) and isinstance(module.backbone, TransformerEncoder)):
        raise CrlValueError(
            "export: only models of kind 'transformer' export to sentence-transformers; this "
            f"tower is a {type(getattr(module, 'backbone', module)).__name__}"
        )
    tokenizer = model.text_featurizer
    if not isinstance(tokenizer, TransformerTokenizer):
        raise CrlValueError("export: the model has no transformer tokenizer")
    encoder = module.backbone
    transformer = Transformer(str(model_dir), max_seq_length=tokenizer.max_seq_length)
    transformer.model.load_state_dict(encoder.model.state_dict())
    modules: list[Any] = [transformer, Pooling(encoder.dim, pooling_mode=encoder.pooling)]
    dense = _dense(module.head)
    if dense is not None:
        modules.append(dense)
    if model.normalize:
        modules.append(Normalize())
    return modules


def export_sentence_transformers(model: DualEncoder, out: str | Path, *, model_dir: Path,
                                 tower: Literal["a", "b"] = "a") -> Path:
    """Write ``model``'s tower as a sentence-transformers directory at ``out``.

    Args:
        model: A dual encoder built by ``model.kind: transformer``.
        out: The directory to write (must not exist, or be empty).
        model_dir: The pretrained directory the model was built from.
        tower: ``a`` (queries) or ``b`` (documents); both are the same for a shared tower.

    Returns:
        ``out`` as a path.

    Raises:
        CrlValueError: if ``out`` holds files, or the model cannot be exported (see
            :func:`sentence_transformer_modules`).
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    from sentence_transformers import SentenceTransformer

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CrlValueError(f"export: {out} already exists and is not an empty directory; "
                            "choose another OUT")
    if tower not in ("a", "b"):
        raise CrlValueError(f"export: `tower` must be 'a' or 'b'; got {tower!r}")
    modules = sentence_transformer_modules(model, tower=tower, model_dir=model_dir)
    st = SentenceTransformer(modules=modules, device="cpu")
    st.save(str(out), safe_serialization=True)
    return out
