"""The towers of a group's runs on one batch (:class:`~crl.train.steps.group.GroupStep`).

- :class:`StackedTowers`: one forward pass of the stacked towers: each linear layer's weights
  stacked ``(G, out, in)`` (``torch.stack``, so the gradients flow back to each run's own
  parameters) and multiplied run by run in one :func:`torch.func.vmap` call, embedding bags one
  call per run; only for towers of :data:`EXACT_MODULES`, whose batched gradients are bit for
  bit one run's;
- :class:`SeparateTowers`: each run's towers on their own, under the run's RNG stream (any
  towers, dropout included).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import vmap

from crl.models import DualEncoder
from crl.models.bag import EmbeddingBagEncoder
from crl.models.towers import Tower
from crl.train.step import Learner, embed
from crl.train.steps.group import GroupingError

#: Activations applied element-wise to the runs' stacked activations ``(G, B, ...)``.
ELEMENTWISE: tuple[type[nn.Module], ...] = (nn.Identity, nn.ReLU, nn.GELU, nn.Tanh, nn.SiLU)
#: Module types :class:`StackedTowers` runs for ``G`` runs at once, each checked equal, bit for bit,
#: to one run's forward and backward (``tests/train/test_grouped.py``). Layer norm is not among
#: them: its vmapped backward sums the affine gradients in another order (differences of 1e-7
#: that grow over a run), so towers with one train one run at a time.
EXACT_MODULES: tuple[type[nn.Module], ...] = (
    DualEncoder, Tower, EmbeddingBagEncoder, nn.Sequential, nn.Linear, nn.EmbeddingBag,
    nn.Flatten, *ELEMENTWISE)

_linear = vmap(F.linear)  # (G, B, in) x (G, out, in) x (G, out): one product per run


def _stack(tensors: list[Tensor], dim: int, cache: dict[tuple[int, int], Tensor]) -> Tensor:
    """The runs' parameters stacked, once per step (a shared tower uses them for both views; the
    two gradients add up as in one run)."""
    key = (id(tensors[0]), dim)
    if key not in cache:
        cache[key] = torch.stack(tensors) if dim == 0 else torch.cat(tensors, dim=dim)
    return cache[key]


def _bag(encoders: list[EmbeddingBagEncoder], ids: Tensor) -> Tensor:
    """``G`` embedding bags over the same ids ``(B, L)``, ``(G, B, d)``: the batch's rows found
    once (for sparse tables, :mod:`crl.models.bag_rows`), then one call per run, as the tables
    are large and the outputs small (side by side in one call, ``(V, G d)``, the tables' copy
    and the copy of its gradient cost more than the calls save; measured in
    benchmarks/grouped.py)."""
    rows = encoders[0].rows(ids)
    return torch.stack([encoder.pool(rows) for encoder in encoders])


def _forward(modules: list[nn.Module], x: Tensor, cache: dict[tuple[int, int], Tensor]
             ) -> Tensor:
    """The modules (one per run, of one type) on the runs' inputs ``x (G, B, ...)``; an
    embedding bag takes the runs' shared ids ``(B, L)``."""
    first = modules[0]
    if isinstance(first, Tower):
        towers = cast("list[Tower]", modules)
        inner = _forward([t.backbone for t in towers], x, cache)
        return _forward([t.head for t in towers], inner, cache)
    if isinstance(first, nn.Sequential):
        for layers in zip(*modules, strict=True):
            x = _forward(list(layers), x, cache)
        return x
    if isinstance(first, EmbeddingBagEncoder):
        return _bag(cast("list[EmbeddingBagEncoder]", modules), x)
    if isinstance(first, nn.Linear):
        linears = cast("list[nn.Linear]", modules)
        weight = _stack([m.weight for m in linears], 0, cache)
        if first.bias is None:
            out: Tensor = vmap(F.linear)(x, weight)
            return out
        bias = _stack([cast(Tensor, m.bias) for m in linears], 0, cache)
        stacked: Tensor = _linear(x, weight, bias)
        return stacked
    if isinstance(first, nn.Flatten):  # one more leading dimension than a run's
        return x.flatten(first.start_dim + 1, first.end_dim if first.end_dim < 0
                         else first.end_dim + 1)
    if isinstance(first, ELEMENTWISE):
        return first(x)  # type: ignore[no-any-return]
    raise GroupingError(f"grouped training: no grouped forward for {type(first).__name__}")


class StackedTowers:
    """The towers of ``G`` runs, run once for all of them on a batch (module docstring).

    Raises:
        GroupingError: for towers with buffers, with modules not in :data:`EXACT_MODULES`, or
            of different structure.
    """

    def __init__(self, models: list[DualEncoder]) -> None:
        first = models[0]
        if any(True for _ in first.buffers()):
            raise GroupingError("grouped training: the towers hold buffers (batch norm)")
        other = sorted({type(m).__name__ for m in first.modules()
                        if type(m) not in EXACT_MODULES})
        if other:
            raise GroupingError(f"grouped training: the towers hold {', '.join(other)}, whose "
                                "batched gradients are not exactly one run's")
        if any([type(m) for m in model.modules()] != [type(m) for m in first.modules()]
               for model in models):
            raise GroupingError("grouped training: the runs' models differ")
        self.models = models

    def _tower(self, towers: list[nn.Module], x: Tensor,
               cache: dict[tuple[int, int], Tensor]) -> Tensor:
        first = towers[0]
        inputs = x if isinstance(_first_leaf(first), EmbeddingBagEncoder) else \
            x.expand(len(towers), *x.shape)  # the same batch for every run
        z = _forward(towers, inputs, cache)
        return F.normalize(z, dim=-1) if self.models[0].normalize else z

    def __call__(self, learners: Sequence[Learner], xa: Any, xb: Any) -> tuple[Tensor, Tensor]:
        """``za, zb`` of shape ``(G, B, D)``: each run's embeddings of the batch (the models
        given at construction, in the learners' order).

        Raises:
            GroupingError: when the towers draw random numbers (dropout): their draws would not
                be each run's own.
        """
        before = torch.get_rng_state()
        cache: dict[tuple[int, int], Tensor] = {}
        za = self._tower([m.tower_a for m in self.models], xa, cache)
        zb = self._tower([m.tower_b for m in self.models], xb, cache)
        if not torch.equal(before, torch.get_rng_state()):
            raise GroupingError("grouped training: the towers draw random numbers in training")
        return za.float(), zb.float()


class SeparateTowers:
    """The towers of ``G`` runs, each on its own (:func:`crl.train.step.embed`, under the run's
    RNG stream): exact for any tower, dropout included; the batch, the data and the process are
    shared."""

    def __call__(self, learners: Sequence[Learner], xa: Any, xb: Any
                 ) -> tuple[list[Tensor], list[Tensor]]:
        """``za[g], zb[g]`` of shape ``(B, D)``: run ``g``'s embeddings of the batch."""
        za, zb = [], []
        for run in learners:
            with run.rng:
                a, b, _ = embed(run.model, xa, xb, None, contextlib.nullcontext())
            za.append(a)
            zb.append(b)
        return za, zb


def _first_leaf(module: nn.Module) -> nn.Module:
    """The module a tower's input goes to first."""
    while isinstance(module, (Tower, nn.Sequential)) and len(list(module.children())):
        module = module.backbone if isinstance(module, Tower) else module[0]
    return module


__all__ = ["ELEMENTWISE", "EXACT_MODULES", "SeparateTowers", "StackedTowers"]
