"""Embed with a trained dual encoder: a list of texts (``crl encode``), or the hard negatives of
a prepared split (for held-out metrics with ``eval.hard_negatives``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from crl.errors import CrlValueError
from crl.models.dual import DualEncoder

View = Literal["a", "b"]


def _encoder(model: DualEncoder, view: View) -> Any:
    if view not in ("a", "b"):
        raise CrlValueError(f"encode: `view` must be 'a' or 'b'; got {view!r}")
    return model.encode_a if view == "a" else model.encode_b


@torch.no_grad()
def encode_inputs(model: DualEncoder, inputs: Tensor, *, view: View = "a", batch_size: int = 256,
                  device: torch.device | str = "cpu", progress: bool = False,
                  description: str = "encoding") -> Tensor:
    """Embeddings ``(N, D)`` (float32, on the CPU) of prepared inputs ``(N, ...)`` of one view.

    The model runs in eval mode for the pass (its previous mode is restored).

    Args:
        model: A trained :class:`DualEncoder`.
        inputs: ``(N, ...)`` inputs of the view (token ids, features, vectors).
        view: ``a`` (the query tower) or ``b`` (the document tower).
        batch_size: Inputs per forward pass.
        device: Where the model runs.
        progress: Show a progress bar.
        description: The progress bar's label.
    """
    if batch_size < 1:
        raise CrlValueError(f"encode: `batch_size` must be >= 1; got {batch_size}")
    encode = _encoder(model, view)
    from rich.progress import Progress

    was_training = model.training
    model.eval()
    out = []
    try:
        with Progress(transient=True, disable=not progress) as bar:
            task = bar.add_task(description, total=len(inputs))
            for start in range(0, len(inputs), batch_size):
                chunk = inputs[start:start + batch_size]
                out.append(encode(chunk.to(device)).float().cpu())  # (b, D)
                bar.advance(task, len(chunk))
    finally:
        model.train(was_training)
    if not out:
        raise CrlValueError("encode: there is nothing to embed (0 inputs)")
    return torch.cat(out)


def encode_texts(model: DualEncoder, texts: Sequence[str], *, view: View = "a",
                 batch_size: int = 256, device: torch.device | str = "cpu",
                 progress: bool = False) -> Tensor:
    """Embeddings ``(N, D)`` of ``texts`` through the tower of ``view`` (float32, CPU).

    Raises:
        CrlValueError: if the model takes no text (it has no text featurizer) or ``texts`` is
            empty.
    """
    if model.text_featurizer is None:
        raise CrlValueError("encode: this model takes tensors, not texts (it was trained on "
                            "vector or image data)")
    if len(texts) == 0:
        raise CrlValueError("encode: there is nothing to embed (0 texts)")
    inputs = model.text_featurizer(list(texts))  # (N, ...)
    return encode_inputs(model, inputs, view=view, batch_size=batch_size, device=device,
                         progress=progress, description=f"embedding {len(texts)} texts")


def encode_hard_negatives(model: DualEncoder, dataset: Any, *, batch_size: int,
                          device: torch.device | str = "cpu") -> Tensor | None:
    """Embeddings ``(N, H, D)`` of the hard negatives of a prepared split (view b), or None
    when the split has none."""
    hard = dataset.hard_negative_views()
    if hard is None or not isinstance(hard, Tensor):
        return None
    n, h = hard.shape[:2]
    z = encode_inputs(model, hard.flatten(0, 1), view="b", batch_size=batch_size,
                      device=device)  # (N H, D)
    return z.reshape(n, h, -1)  # (N, H, D)
