"""Export a fine-tuned ``transformer`` tower as a sentence-transformers model directory.

The directory is built from sentence-transformers' own modules and written by its ``save``
(weights as safetensors): ``Transformer`` (the fine-tuned weights, the tokenizer and
``max_seq_length``), ``Pooling`` (``mean`` or ``cls``, as crl pooled), a ``Dense`` layer with
no activation for a ``linear`` head (a ``residual`` head ``x + W x + b`` becomes the linear map
``(I + W) x + b``), and ``Normalize`` when the model L2-normalises. A model with two towers
exports as one asymmetric model: sentence-transformers' ``Router`` sends ``encode_query`` to
tower ``a`` and ``encode_document`` (and a plain ``encode``) to tower ``b``.
``SentenceTransformer(OUT)`` then loads it offline and gives the run's own embeddings
(docs/data.md, "Export").

A model trained with ``loss.matryoshka`` is tagged ``matryoshka`` and its model card
(``README.md``) lists the trained prefix dimensions, with how to load it at one of them
(``SentenceTransformer(OUT, truncate_dim=d)``; docs/training.md, "Matryoshka embeddings").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch import nn

from crl.errors import CrlValueError
from crl.models.dual import DualEncoder
from crl.models.towers import ResidualLinear, Tower
from crl.models.transformer import TransformerEncoder, TransformerTokenizer
from crl.rundir import atomic_directory

ExportFormat = Literal["sentence-transformers"]
FORMATS: tuple[str, ...] = ("sentence-transformers",)
#: What to export: the query tower, the document tower, or both (one asymmetric model).
ExportTower = Literal["a", "b", "both"]
TOWERS: tuple[str, ...] = ("a", "b", "both")


def check_tower(tower: object) -> ExportTower:
    """``tower`` if it is one of :data:`TOWERS`, else a :class:`CrlValueError` naming it."""
    if tower not in TOWERS:
        raise CrlValueError(f"export: `--tower` must be one of {', '.join(TOWERS)}; got "
                            f"{tower!r}")
    return cast(ExportTower, tower)


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


def sentence_transformer_modules(model: DualEncoder, *, tower: ExportTower = "both",
                                 model_dir: Path) -> list[Any]:
    """The sentence-transformers modules that compute ``model.encode_<tower>`` on texts.

    Args:
        model: A dual encoder built by ``model.kind: transformer``.
        tower: ``a``, ``b`` (one tower; the same for a shared tower) or ``both``: for two
            towers a ``Router`` whose ``query`` route is tower ``a`` and whose ``document``
            route (also the default) is tower ``b``; for a shared tower, that tower.
        model_dir: The pretrained directory the tower was built from (its config and
            tokenizer files; the weights are replaced by the fine-tuned ones).

    Raises:
        CrlValueError: for a model that is not a transformer tower, or a head with no
            sentence-transformers equivalent (``mlp``).
    """
    from sentence_transformers.sentence_transformer.modules import Normalize, Router

    if tower == "both" and not model.shared:
        router = Router.for_query_document(
            query_modules=_tower_modules(model, "a", model_dir),
            document_modules=_tower_modules(model, "b", model_dir))
        return [router, Normalize()] if model.normalize else [router]
    modules = _tower_modules(model, "b" if tower == "b" else "a", model_dir)
    return [*modules, Normalize()] if model.normalize else modules


def _tower_modules(model: DualEncoder, tower: Literal["a", "b"], model_dir: Path) -> list[Any]:
    """``Transformer``, ``Pooling`` and the head's ``Dense`` (if any) of one tower."""
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

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
    return modules


def matryoshka_card(dims: Sequence[int], full: int) -> str:
    """The model card's section on the Matryoshka prefix dimensions ``dims`` of a model whose
    embeddings have ``full`` dimensions (Markdown).

    Example:
        >>> print(matryoshka_card([384, 64], 384).splitlines()[2])
        Trained with Matryoshka prefixes (crl's `loss.matryoshka`) at dimensions 384, 64:
    """
    listed = ", ".join(str(d) for d in sorted(dims, reverse=True))
    smallest = min(dims)
    return (
        "## Matryoshka dimensions\n\n"
        f"Trained with Matryoshka prefixes (crl's `loss.matryoshka`) at dimensions {listed}:\n"
        f"the first `d` of the {full} coordinates of an embedding are an embedding on their\n"
        "own. Load the model at one of them with\n\n"
        "```python\n"
        "from sentence_transformers import SentenceTransformer\n\n"
        f'model = SentenceTransformer("path/to/this/model", truncate_dim={smallest})\n'
        "```\n\n"
        "and compare truncated embeddings by cosine similarity (`model.similarity`): they are\n"
        "not unit length. Dimensions other than these were not trained.\n")


def export_sentence_transformers(model: DualEncoder, out: str | Path, *, model_dir: Path,
                                 tower: ExportTower = "both",
                                 matryoshka_dims: Sequence[int] = ()) -> Path:
    """Write ``model`` as a sentence-transformers directory at ``out``.

    The directory is written beside ``out`` under a temporary name and renamed into place, so
    ``out`` never holds a half-written model.

    Args:
        model: A dual encoder built by ``model.kind: transformer``.
        out: The directory to write (must not exist, or be empty).
        model_dir: The pretrained directory the model was built from.
        tower: ``both`` (the default: a shared tower as it is, two towers as one asymmetric
            model with ``encode_query`` / ``encode_document``), ``a`` (queries) or ``b``
            (documents).
        matryoshka_dims: The prefix dimensions the model was trained at (``loss.matryoshka``):
            a ``matryoshka`` tag and a card section (:func:`matryoshka_card`); empty: none.

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
    modules = sentence_transformer_modules(model, tower=check_tower(tower), model_dir=model_dir)
    st = SentenceTransformer(modules=modules, device="cpu")
    if matryoshka_dims:
        st.model_card_data.add_tags(["matryoshka"])
    with atomic_directory(out) as staging:  # renamed into place, or removed on any error
        st.save(str(staging), safe_serialization=True)
        if matryoshka_dims:
            card = Path(staging) / "README.md"
            text = card.read_text(encoding="utf-8") if card.exists() else ""
            full = st.get_embedding_dimension() or max(matryoshka_dims)
            card.write_text(text.rstrip("\n") + "\n\n" + matryoshka_card(matryoshka_dims, full),
                            encoding="utf-8")
    return out
