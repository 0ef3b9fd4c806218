"""Matryoshka embeddings (Kusupati et al. 2022, arXiv:2205.13147): one objective over several
prefixes of the embedding, so that its first ``d`` coordinates are an embedding on their own.

With prefix dimensions ``d_1 > ... > d_K`` and weights ``w_k`` (``loss.matryoshka``), the loss
of a batch is

    L = sum_k w_k * L_inner(prefix(za, d_k), prefix(zb, d_k), ...)

with ``prefix(z, d) = z[:, :d] / ||z[:, :d]||`` when the model L2-normalises its embeddings
(``model.normalize``: the inner loss is written for unit vectors, and a prefix of a unit
vector is not one) and ``z[:, :d]`` otherwise; hard negatives are cut the same way. This is
sentence-transformers' ``MatryoshkaLoss`` around the same inner loss (its ``shrink`` cuts and
normalises; its similarity functions are cosines). The full dimension is used as given.

Each prefix has its own copy of the inner loss: its learnable state (CLIP's logit scale,
SigLIP's scale and bias, GCL's per-sample estimates ``u`` and temperatures) belongs to the
similarities of that prefix. The batch's negatives and the k-means regulariser are shared.

Gradient caching needs nothing more: the cached gradient of an embedding is the sum over the
prefixes of their gradients, which one backward pass through the cuts gives exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from crl._validation import compute_dtype, upcast
from crl.errors import CrlValueError
from crl.losses.objective import Objective


def truncate(z: Tensor, dim: int, *, normalize: bool) -> Tensor:
    """The first ``dim`` coordinates of embeddings ``z (..., D)``, L2-normalised again when
    ``normalize``; ``z`` itself when ``dim >= D``. A bfloat16 prefix is normalised in float32
    (and returned in bfloat16).

    Example:
        >>> import torch
        >>> truncate(torch.tensor([[3.0, 4.0, 12.0]]) / 13, 2, normalize=True)
        tensor([[0.6000, 0.8000]])
    """
    if dim >= z.shape[-1]:
        return z
    head = z[..., :dim]  # (..., d)
    if not normalize:
        return head
    return F.normalize(upcast(head, compute_dtype(head)), dim=-1).to(z.dtype)


class MatryoshkaObjective(Objective):
    """The Matryoshka sum (module docstring) of one :class:`~crl.losses.Objective` per prefix.

    It is the largest prefix's objective (``loss``, ``negatives``, ``regulariser``, the
    temperature of the held-out risk) with the others in ``smaller``; ``after_step`` and
    ``set_epoch`` reach every copy.

    Args:
        objectives: One objective per dimension, in the order of ``dims``.
        dims: The prefix dimensions, strictly decreasing.
        weights: Their weights.
        normalize: Renormalise prefixes (the model L2-normalises its embeddings).

    Example:
        >>> import torch
        >>> from crl.losses.infonce import InfoNCELoss
        >>> from crl.losses.objective import BatchNegatives
        >>> parts = [Objective(InfoNCELoss(temperature=1.0), BatchNegatives(None))
        ...          for _ in range(2)]
        >>> objective = MatryoshkaObjective(parts, [3, 2], [1.0, 0.5], normalize=True)
        >>> loss, _ = objective(torch.eye(3), torch.eye(3), torch.arange(3))
        >>> round(float(loss), 4)
        0.9184
    """

    def __init__(self, objectives: Sequence[Objective], dims: Sequence[int],
                 weights: Sequence[float], *, normalize: bool) -> None:
        if not (len(objectives) == len(dims) == len(weights) >= 1):
            raise CrlValueError(f"MatryoshkaObjective: `objectives`, `dims` and `weights` must "
                                f"be non-empty and of one length; got {len(objectives)}, "
                                f"{len(dims)}, {len(weights)}")
        if any(a <= b for a, b in itertools.pairwise(dims)):
            raise CrlValueError(f"MatryoshkaObjective: `dims` must be strictly decreasing; got "
                                f"{list(dims)}")
        first = objectives[0]
        super().__init__(first.loss, first.negatives, first.regulariser)
        self.smaller = nn.ModuleList(objectives[1:])
        self.prefix_dims: tuple[int, ...] = tuple(int(d) for d in dims)
        self.weights = tuple(float(w) for w in weights)
        self.normalize = bool(normalize)

    def forward(self, za: Tensor, zb: Tensor, index: Tensor, labels: Tensor | None = None, *,
                rows: slice | None = None, hard: Tensor | None = None
                ) -> tuple[Tensor, dict[str, float]]:
        """The weighted sum over prefixes of the inner objective (:meth:`Objective.forward`'s
        arguments and return); the logs are the largest prefix's.

        Raises:
            CrlValueError: when the embeddings have fewer than the largest prefix's
                coordinates, and as :meth:`Objective.forward`.
        """
        width = za.shape[-1] if za.dim() >= 1 else 0
        if width < self.prefix_dims[0]:
            raise CrlValueError(f"loss.matryoshka.dims must be at most the embedding dimension "
                                f"D = {width}; got {list(self.prefix_dims)}")
        parts = [super().forward, *self.smaller]
        values: list[Tensor] = []
        logs: dict[str, float] = {}
        for part, dim, weight in zip(parts, self.prefix_dims, self.weights, strict=True):
            cut = [None if z is None else truncate(z, dim, normalize=self.normalize)
                   for z in (za, zb, hard)]
            value, more = part(cut[0], cut[1], index, labels, rows=rows, hard=cut[2])
            values.append(weight * value)
            logs = logs or more  # the largest prefix's
        total = values[0]
        for value in values[1:]:
            total = total + value
        return total, logs

    def set_epoch(self, epoch: int) -> None:
        """Every prefix's :meth:`Objective.set_epoch`."""
        super().set_epoch(epoch)
        for part in self._smaller():
            part.set_epoch(epoch)

    def after_step(self) -> None:
        """Every prefix's :meth:`Objective.after_step`."""
        super().after_step()
        for part in self._smaller():
            part.after_step()

    def _smaller(self) -> list[Objective]:
        return [part for part in self.smaller if isinstance(part, Objective)]


__all__ = ["MatryoshkaObjective", "truncate"]
