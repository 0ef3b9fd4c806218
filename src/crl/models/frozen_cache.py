"""The frozen bottom of a transformer computed once per text (``model.freeze_layers: k``):
the hidden states after the embeddings and the first ``k`` layers depend only on the text's
tokens, so they are cached on content and a forward pass runs the trained top layers only.

The frozen part is computed as in evaluation (no dropout: its output is then a function of
the text, which is what makes it cacheable); the top layers keep their dropout in training.
With that, a cached forward pass gives the uncached model's outputs and gradients (up to float
rounding: a text's states are computed in another batch, whose padding can change the order of
sums). Padding positions are zeros in the cached states: the attention mask gives them zero
weight, and mean pooling skips them.

Every ``model.kind: transformer`` with ``freeze_layers >= 1`` of a supported type uses it: the
encoder decides once, when it is built (:meth:`crl.models.transformer.TransformerEncoder.__init__`),
and takes the process's cache of its pretrained directory and ``k`` (:func:`shared_outputs`), so
every run and seed a process trains (a study's worker, a group of runs) computes a text's frozen
states once. A copy of an encoder (``copy.deepcopy``: a group's runs) shares its cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from crl.errors import CrlValueError

# Model types whose layers are followed by nothing before the output (no final norm), so the
# output of a model cut after layer k is the input of layer k + 1 (tested: BERT, MiniLM's kind).
SUPPORTED = ("bert",)


class _Given(nn.Module):
    """Stands in for the embeddings: returns the hidden states it is handed."""

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        out: Tensor = kwargs["inputs_embeds"]
        return out


@contextlib.contextmanager
def _swapped(owner: nn.Module, name: str, module: nn.Module) -> Iterator[None]:
    old = getattr(owner, name)
    setattr(owner, name, module)
    try:
        yield
    finally:
        setattr(owner, name, old)


class FrozenOutputs:
    """Hidden states ``(length, hidden)`` after a transformer's frozen bottom, per text (the
    bytes of its token ids), filled on first sight.

    Args:
        identity: What the states are of (the pretrained directory and ``k``); an encoder of
            another identity is refused.
    """

    def __init__(self, identity: tuple[str, int]) -> None:
        self.identity = identity
        self._states: dict[bytes, Tensor] = {}
        self.computed = 0  # texts run through the frozen part

    def __len__(self) -> int:
        return len(self._states)

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenOutputs:
        """A copied encoder shares the cache: its states are a function of the text alone."""
        return self

    def nbytes(self) -> int:
        """The memory the cached states take."""
        return sum(t.numel() * t.element_size() for t in self._states.values())

    def states(self, model: nn.Module, layers: nn.ModuleList, layer_owner: tuple[nn.Module, str],
               ids: Tensor, mask: Tensor) -> Tensor:
        """``(B, W, hidden)``: the batch's cached states (``ids``, ``mask`` ``(B, W)``),
        computing the missing texts' through the embeddings and ``layers`` in eval mode."""
        lengths = mask.sum(dim=1).tolist()
        keys = [row[:n].cpu().numpy().tobytes() for row, n in zip(ids, lengths, strict=True)]
        missing: dict[bytes, int] = {}  # each unseen text once, at its first row
        for i, key in enumerate(keys):
            if key not in self._states:
                missing.setdefault(key, i)
        if missing:
            rows = list(missing.values())
            self._compute(model, layers, layer_owner, ids[rows], mask[rows], list(missing),
                          [lengths[i] for i in rows])
        first = self._states[keys[0]]
        out = torch.zeros(ids.shape[0], ids.shape[1], first.shape[-1], dtype=first.dtype,
                          device=ids.device)  # (B, W, hidden), padding zero
        for i, (key, n) in enumerate(zip(keys, lengths, strict=True)):
            out[i, :n] = self._states[key].to(ids.device)
        return out

    @torch.no_grad()
    def _compute(self, model: nn.Module, layers: nn.ModuleList,
                 layer_owner: tuple[nn.Module, str], ids: Tensor, mask: Tensor,
                 keys: list[bytes], lengths: list[int]) -> None:
        was_training = model.training
        model.eval()
        try:
            with _swapped(*layer_owner, layers):
                hidden: Tensor = model(input_ids=ids, attention_mask=mask).last_hidden_state
        finally:
            model.train(was_training)
        for key, n, row in zip(keys, lengths, hidden, strict=True):
            self._states[key] = row[:n].detach().clone()  # (length, hidden)
        self.computed += len(keys)


_SHARED: dict[tuple[tuple[str, int], tuple[tuple[str, int, int], ...]], FrozenOutputs] = {}


def _weights_stamp(directory: str) -> tuple[tuple[str, int, int], ...]:
    """The weight files of ``directory`` as (name, size, mtime): a model saved again in the
    same place gets a new cache."""
    found = []
    for path in sorted(Path(directory).iterdir()) if Path(directory).is_dir() else []:
        if path.suffix in (".safetensors", ".bin") and path.is_file():
            stat = path.stat()
            found.append((path.name, stat.st_size, stat.st_mtime_ns))
    return tuple(found)


def shared_outputs(identity: tuple[str, int]) -> FrozenOutputs:
    """This process's cache of the frozen states of ``identity`` (a pretrained directory and
    ``k``), created on first use and kept for the process's life: every encoder of that model
    and ``k`` built in the process (the runs and seeds of a study's worker) fills and reads
    the same one."""
    key = (identity, _weights_stamp(identity[0]))
    if key not in _SHARED:
        _SHARED[key] = FrozenOutputs(identity)
    return _SHARED[key]


def layer_owner(model: nn.Module, paths: tuple[str, ...]) -> tuple[nn.Module, str]:
    """The module holding a transformer's list of layers and its attribute name."""
    for path in paths:
        *parents, name = path.split(".")
        owner: Any = model
        for part in parents:
            owner = getattr(owner, part, None)
        if isinstance(getattr(owner, name, None), nn.ModuleList):
            return owner, name
    raise CrlValueError(f"cache_frozen: cannot find the layers of {type(model).__name__}")


def top_forward(model: nn.Module, top: nn.ModuleList, owner: tuple[nn.Module, str],
                states: Tensor, mask: Tensor) -> Tensor:
    """``(B, W, hidden)`` last hidden states: the frozen part's ``states`` through the ``top``
    layers, with the model's own attention-mask handling (the embeddings stood in for)."""
    if len(top) == 0:
        return states
    with _swapped(*owner, top), _swapped(model, "embeddings", _Given()):
        out: Tensor = model(inputs_embeds=states, attention_mask=mask).last_hidden_state
    return out


def is_supported(model: nn.Module) -> bool:
    """Whether the cache serves ``model`` exactly (its type is in :data:`SUPPORTED`)."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    return kind in SUPPORTED and isinstance(getattr(model, "embeddings", None), nn.Module)


def check_supported(model: nn.Module, freeze_layers: int) -> None:
    """Refuse what the cache cannot serve exactly: no frozen layer, or a model type whose
    layers' output is not the model's (:data:`SUPPORTED`).

    Raises:
        CrlValueError: naming the setting and what it got.
    """
    if freeze_layers < 1:
        raise CrlValueError("cache_frozen: needs model.freeze_layers >= 1 (the frozen part to "
                            f"cache); got {freeze_layers}")
    if not is_supported(model):
        kind = getattr(getattr(model, "config", None), "model_type", None)
        raise CrlValueError(f"cache_frozen: supports model types {', '.join(SUPPORTED)}; got "
                            f"{kind!r}")


__all__ = ["SUPPORTED", "FrozenOutputs", "check_supported", "is_supported", "layer_owner",
           "shared_outputs", "top_forward"]
