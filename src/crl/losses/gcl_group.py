"""The GCL losses of a group of runs on one batch, in one computation (docs/theory.md §10).

Runs trained together (:func:`crl.train.fit_group`) see the same batch; each has its own
embeddings, negatives mask, ``u`` estimates, temperature and gamma. :class:`GroupedGcl` gives
each run the loss and gradients its own :class:`~crl.losses.Objective` gives it, bit for bit,
with the ``(B, B)`` work of the ``G`` runs stacked ``(G, B, B)``: masks, positives, the shifted
logits ``Delta = (s - s_ii) / tau``, the masked log-sum-exp and the ratio ``g_hat / u``, one op
each for the group instead of one per run and direction. What stays per run is what fixes the
rounding of a run's own arithmetic:

- each run's logits ``s = a[has] @ b.T`` come from the same product of its own anchors with a
  negative (``has``) as alone (a product of all ``B`` rows, or a batched one, rounds rows of few
  anchors and the gradient contracted over them differently);
- its ``u`` update (:meth:`GlobalContrastiveLoss._update`, the same call: ``logaddexp`` rounds
  the last elements of a vector differently from the others);
- its sum over its own anchors (the order of a sum depends on its length).

Everything else is element-wise, or a reduction along rows of ``B`` candidates, whose values do
not depend on which other rows sit beside them (``tests/losses/test_gcl_group.py`` checks the
losses, gradients and ``u`` states against the runs' own objectives, and the group's summaries
against training with them).

:func:`grouped_gcl` decides once, when a group is built, whether its objectives can be computed
this way: plain (not tiled) GCL with a fixed temperature, the same ``symmetric`` and
``include_positive``, no hard negatives, guide, regulariser or Matryoshka prefixes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from crl.errors import CrlValueError
from crl.losses._common import masked_logsumexp
from crl.losses._gcl_temperature import FixedTemperature
from crl.losses.gcl import GlobalContrastiveLoss
from crl.losses.objective import Objective
from crl.losses.tiled import decide_tiles

#: A run's loss (0-dim, with its graph) and the scalars its objective logs.
RunLoss = tuple[Tensor, dict[str, float]]


def grouped_gcl(objectives: Sequence[Objective], batch_size: int) -> GroupedGcl | None:
    """The group's losses in one computation (:class:`GroupedGcl`), or None where a run's
    objective is not one it computes (module docstring): each run then calls its own.

    Args:
        objectives: The runs' objectives, in order.
        batch_size: The largest batch of the group (``train.batch_size``): its logits must be
            plain, not tiled (:func:`crl.losses.tiled.decide_tiles`).

    Example:
        >>> from crl.losses import build_objective
        >>> from crl.losses.config import LossConfig
        >>> from crl.negatives import NegativesConfig
        >>> runs = [build_objective(LossConfig(name="gcl"),
        ...                         NegativesConfig(regime="shared", m=m), num_samples=20)
        ...         for m in (2, 5)]
        >>> type(grouped_gcl(runs, batch_size=8)).__name__
        'GroupedGcl'
        >>> grouped_gcl([build_objective(LossConfig(name="clip"), NegativesConfig(),
        ...                              num_samples=20)] * 2, batch_size=8) is None
        True
    """
    losses = [o.loss for o in objectives]
    if len(objectives) < 2 or any(type(o) is not Objective or o.regulariser is not None
                                  or o.negatives.guide is not None for o in objectives):
        return None
    if any(type(loss) is not GlobalContrastiveLoss
           or type(loss.temperature_strategy) is not FixedTemperature for loss in losses):
        return None
    gcl = [loss for loss in losses if isinstance(loss, GlobalContrastiveLoss)]
    if len({(loss.symmetric, loss.include_positive) for loss in gcl}) != 1:
        return None
    if any(decide_tiles("grouped_gcl", loss.block_size, batch_size, batch_size) != "plain"
           for loss in gcl):
        return None
    return GroupedGcl(objectives)


class GroupedGcl:
    """The GCL losses of ``G`` runs' objectives on one batch (module docstring); build it with
    :func:`grouped_gcl`, which checks that the objectives are ones it computes.

    Args:
        objectives: The runs' objectives: plain GCL with a fixed temperature, alike in
            ``symmetric`` and ``include_positive``.
    """

    def __init__(self, objectives: Sequence[Objective]) -> None:
        self.objectives = list(objectives)
        self.losses = [o.loss for o in objectives if isinstance(o.loss, GlobalContrastiveLoss)]
        if len(self.losses) != len(self.objectives):
            raise CrlValueError("GroupedGcl: every objective must be GCL's; use grouped_gcl()")
        self.symmetric = self.losses[0].symmetric
        self.include_positive = self.losses[0].include_positive

    def __call__(self, za: Tensor, zb: Tensor, index: Tensor, labels: Tensor | None
                 ) -> list[RunLoss]:
        """Each run's loss and logs, as ``objective(za[g], zb[g], index, labels)`` gives them;
        updates every run's ``u`` estimates of the batch's samples.

        Args:
            za: ``(G, B, D)`` float32: run ``g``'s view-a embeddings at ``[g]``.
            zb: ``(G, B, D)`` float32: its view-b embeddings.
            index: ``(B,)`` int64 dataset indices of the batch (distinct).
            labels: ``(B,)`` labels or None (for negative sets that use them).

        Raises:
            CrlValueError: when ``za``, ``zb`` are not ``(G, B, D)`` for the group's ``G`` runs
                and ``index`` is not ``(B,)``.
        """
        runs, batch = len(self.objectives), za.shape[1]
        if za.dim() != 3 or za.shape[0] != runs or zb.shape != za.shape \
                or tuple(index.shape) != (batch,):
            raise CrlValueError(f"GroupedGcl: `za`, `zb` must be ({runs}, B, D) and `index` "
                                f"(B,); got {tuple(za.shape)}, {tuple(zb.shape)}, "
                                f"{tuple(index.shape)}")
        rows = slice(0, batch)
        whole = torch.ones(batch, batch, dtype=torch.bool, device=za.device)
        masks = [o.negatives(index, labels, rows) for o in self.objectives]
        negatives = torch.stack([  # (G, B, B), a copy
            whole if m is None else m.to(za.device) if isinstance(m, Tensor)
            else m.mask(index, index) for m in masks])
        negatives.diagonal(dim1=1, dim2=2).fill_(False)  # an anchor's positive is no negative
        counted = negatives.any(dim=2)  # (G, B): anchors with a negative
        allowed = negatives
        if self.include_positive:  # Delta_ii = 0: the positive adds exp(0) = 1
            allowed = negatives.clone()
            allowed.diagonal(dim1=1, dim2=2).fill_(True)
        sizes = counted.sum(dim=1).tolist()  # A_g
        anchors = counted.nonzero()[:, 1].contiguous()  # (sum A,) runs' anchors in order
        has = anchors.split_with_sizes(sizes)
        samples = index[anchors].split_with_sizes(sizes)
        tau = torch.stack([loss.temperature.to(device=za.device, dtype=za.dtype)
                           for loss in self.losses])  # (G,)
        tau_anchors = tau.repeat_interleave(torch.tensor(sizes, device=za.device))  # (sum A,)
        log_count = torch.log(allowed.sum(dim=2).to(za.dtype).clamp(min=1))  # (G, B)
        shape = (runs, batch, batch)

        def direction(x: Tensor, y: Tensor, states: list[Tensor]) -> list[Tensor]:
            """Each run's sum of ``tau g_hat / u`` over its anchors with a negative."""
            xs, ys = x.unbind(0), y.unbind(0)
            logits = torch.cat([xs[g][has[g]] @ ys[g].T for g in range(runs)])  # (sum A, B)
            s = logits.view(shape) if sum(sizes) == runs * batch else \
                logits.new_zeros(shape).index_put((counted,), logits)  # (G, B, B)
            positive = s.diagonal(dim1=1, dim2=2).unsqueeze(2)  # (G, B, 1): s_ii
            delta = (s - positive) / tau.view(runs, 1, 1)
            log_g_hat = (masked_logsumexp(delta, allowed, dim=2) - log_count)[counted]
            with torch.no_grad():  # each run's own update, as alone
                log_u = torch.cat([
                    loss._update(state, samples[g], part) if sizes[g] else part.detach()
                    for g, (loss, state, part) in enumerate(zip(
                        self.losses, states, log_g_hat.split_with_sizes(sizes), strict=True))])
            values = tau_anchors * torch.exp(log_g_hat - log_u)  # (sum A,)
            return [part.sum() for part in values.split_with_sizes(sizes)]

        totals = torch.stack(direction(za, zb, [loss.log_u_a2b for loss in self.losses]))
        if self.symmetric:  # the same sample-indexed mask serves both directions
            other = torch.stack(direction(zb, za, [loss.log_u_b2a for loss in self.losses]))
            totals = (totals + other) / 2
        counts = torch.tensor(sizes, device=za.device).clamp(min=1)
        losses = totals / counts  # (G,): each run's mean over its counted anchors
        return [(value, loss.logs()) for value, loss in zip(losses.unbind(0), self.losses,
                                                             strict=True)]


__all__ = ["GroupedGcl", "RunLoss", "grouped_gcl"]
