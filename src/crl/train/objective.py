"""The training objective: the loss of the ``loss`` section on a batch's (possibly gathered)
features, with the negatives of the ``negatives`` section.

:class:`Objective` is a function of ``(za, zb, index, labels)`` and the model (for CLIP's
``logit_scale``) only, so distributed training all-gathers those four tensors first and calls it
on the global batch with ``rows``, the rank's own slice: the rank then scores its rows against
all gathered columns, and the mean over ranks of their values is the loss of the global batch
(docs/distributed.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from crl import distributed
from crl._validation import check_rows
from crl.errors import CrlValueError
from crl.losses import (
    GlobalContrastiveLoss,
    clip_loss,
    info_nce,
    oce_risk,
    pairwise_risk,
    relaxed_kmeans,
    siglip_loss,
    supcon_loss,
)
from crl.losses._common import anchor_negatives, masked_logsumexp
from crl.losses.tiled import TileMask, anchor_logsumexp, densify
from crl.negatives import NegativesConfig, build_negative_sets
from crl.train.config import LossConfig


def masked_info_nce_rows(logits: Tensor, negatives: Tensor) -> Tensor:
    """Per-anchor InfoNCE ``(B,)`` of ``logits (B, B)`` (positives on the diagonal) with the
    negatives of ``negatives (B, B)``; anchors without a negative get 0 (and no gradient).

    Example:
        >>> logits = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> masked_info_nce_rows(logits, torch.tensor([[False, True], [False, False]]))
        tensor([0.3133, 0.0000])
    """
    eye = torch.eye(logits.shape[0], dtype=torch.bool, device=logits.device)
    return masked_logsumexp(logits, negatives | eye, dim=1) - logits.diagonal()


def _masked_siglip(logits: Tensor, negatives: Tensor) -> Tensor:
    """SigLIP restricted to the mask: the positive term of every anchor plus its negatives."""
    positive = -F.logsigmoid(logits.diagonal()).sum()
    negative = -(F.logsigmoid(-logits) * negatives).sum()
    return (positive + negative) / logits.shape[0]


class Objective(nn.Module):
    """The loss of a run, built from its ``loss`` and ``negatives`` sections.

    Holds the learnable state of the loss (GCL's ``u`` and temperatures, SigLIP's scale and bias)
    so that it is optimised and checkpointed with the model.

    - ``info_nce``: InfoNCE / NT-Xent at ``temperature`` (both directions when ``symmetric``).
    - ``clip``: the CLIP loss with the model's ``logit_scale``.
    - ``siglip``: SigLIP with its own learnable ``logit_scale`` and ``logit_bias``.
    - ``supcon``: SupCon on both views stacked; positives share a label, or, without labels, an
      index (the two views of one item: SimCLR's NT-Xent).
    - ``gcl``: :class:`~crl.losses.GlobalContrastiveLoss` with per-sample ``u``.
    - ``oce`` / ``pairwise``: the OCE risk / pairwise surrogate of ``Delta = s_ij - s_ii``.

    With ``negatives.regime != "in_batch"`` the batch mask of the negative sets is used (one
    mask for both directions: ``[i, j]`` says sample j is a negative of sample i); anchors with
    no negative in the batch are left out of the mean. ``kmeans_weight > 0`` adds the relaxed
    k-means regulariser of both views.

    Args:
        loss: The ``loss`` section.
        negatives: The ``negatives`` section.
        num_samples: Training pairs ``n`` (indices lie in ``[0, n)``).
        labels: ``(n,)`` training labels (``-1`` or None: unlabelled).
        epochs: Epochs of the run (GCL's cosine gamma decay; None: 1).
        num_classes: Default number of clusters of the k-means regulariser.

    Example:
        >>> obj = Objective(LossConfig(temperature=1.0, symmetric=False), NegativesConfig(),
        ...                 num_samples=10)
        >>> loss, logs = obj(torch.eye(3), torch.eye(3), torch.arange(3), None, nn.Module())
        >>> round(float(loss), 4)
        0.5514
    """

    def __init__(self, loss: LossConfig, negatives: NegativesConfig, *, num_samples: int,
                 labels: Tensor | None = None, epochs: int | None = None,
                 num_classes: int | None = None) -> None:
        super().__init__()
        self.cfg = loss
        self.negatives_cfg = negatives
        usable = labels if labels is not None and bool((labels >= 0).all()) else None
        self.sets = build_negative_sets(negatives, num_samples, usable)
        self.kmeans_k = loss.kmeans_k or num_classes or 10
        self.gcl: GlobalContrastiveLoss | None = None
        self.siglip_scale: nn.Parameter | None = None
        self.siglip_bias: nn.Parameter | None = None
        if loss.name == "gcl":
            g = loss.gcl
            decay = (g.decay_epochs or epochs or 1) if g.gamma_schedule == "cosine" else None
            self.gcl = GlobalContrastiveLoss(
                num_samples, temperature=loss.temperature, gamma=g.gamma,
                gamma_schedule=g.gamma_schedule, gamma_min=g.gamma_min, decay_epochs=decay,
                symmetric=loss.symmetric, temperature_mode=g.temperature_mode, rho=g.rho,
                block_size=loss.block_size)
        elif loss.name == "siglip":
            self.siglip_scale = nn.Parameter(torch.tensor(math.log(10.0)),
                                             requires_grad=loss.learnable_scale)
            self.siglip_bias = nn.Parameter(torch.tensor(-10.0),
                                            requires_grad=loss.learnable_scale)

    def set_epoch(self, epoch: int) -> None:
        """Tell epoch-dependent state (GCL's gamma schedule) the current epoch."""
        if self.gcl is not None:
            self.gcl.set_epoch(epoch)

    def temperature(self, model: nn.Module) -> float:
        """The temperature the loss currently works at (for the held-out contrastive risk)."""
        if self.cfg.name == "clip":
            return 1.0 / float(self._logit_scale(model).detach().exp())
        if self.cfg.name == "siglip":
            assert self.siglip_scale is not None
            return 1.0 / float(self.siglip_scale.detach().exp())
        if self.gcl is not None and self.cfg.gcl.temperature_mode != "fixed":
            return float(self.gcl.temperature.detach().mean())  # per-sample: their mean
        return self.cfg.temperature

    def _logit_scale(self, model: nn.Module) -> Tensor:
        scale = getattr(model, "logit_scale", None)
        if not isinstance(scale, Tensor):
            raise CrlValueError("loss 'clip' needs a model with a `logit_scale` parameter; got "
                                f"{type(model).__name__} without one")
        return scale

    def negatives_mask(self, index: Tensor, labels: Tensor | None) -> Tensor | None:
        """The ``(B, B)`` negatives mask of a batch, or None for every other member."""
        if self.sets is not None:
            return self.sets.batch_mask(index.cpu()).to(index.device)
        if self.negatives_cfg.exclude_same_label:
            if labels is None or bool((labels < 0).any()):
                raise CrlValueError("negatives.exclude_same_label needs labelled data; the "
                                    "batch has unlabelled items (label -1)")
            return labels.unsqueeze(0) != labels.unsqueeze(1)
        return None

    def forward(self, za: Tensor, zb: Tensor, index: Tensor, labels: Tensor | None,
                model: nn.Module, *, rows: slice | None = None) -> tuple[Tensor, dict[str, float]]:
        """The loss of a batch and scalars to log.

        Args:
            za: ``(B, D)`` view-a features (the global batch in distributed training).
            zb: ``(B, D)`` view-b features.
            index: ``(B,)`` dataset indices.
            labels: ``(B,)`` labels (``-1``: none) or None.
            model: The model (CLIP's ``logit_scale`` lives there).
            rows: This rank's anchors, a contiguous slice of ``B / world`` rows (see
                :meth:`local`); None: the whole batch.

        Returns:
            ``(loss, logs)``: a 0-dim tensor and a dict of floats.
        """
        if rows is not None:
            return self.local(za, zb, index, labels, model, rows)
        cfg = self.cfg
        logs: dict[str, float] = {}
        if cfg.name == "gcl" and cfg.block_size is not None and self.sets is not None \
                and not self.negatives_cfg.exclude_same_label:
            # GCL asks the negative sets itself: once per call, or tile by tile for huge batches.
            assert self.gcl is not None
            loss = self.gcl(za, zb, index, self.sets)
            logs["train/gcl_gamma"] = self.gcl.current_gamma
            return self._regularised(loss, za, zb, logs)
        mask = self.negatives_mask(index, labels)
        eye = torch.eye(za.shape[0], dtype=torch.bool, device=za.device)
        if cfg.name == "info_nce":
            loss = (info_nce(za, zb, temperature=cfg.temperature, symmetric=cfg.symmetric,
                             block_size=cfg.block_size)
                    if mask is None else self._info_nce(za @ zb.T / cfg.temperature, mask, eye))
        elif cfg.name == "clip":
            scale = self._logit_scale(model).exp()
            loss = (clip_loss(za, zb, scale, block_size=cfg.block_size) if mask is None
                    else self._info_nce(scale * (za @ zb.T), mask, eye))
            logs["train/logit_scale"] = float(scale.detach())
        elif cfg.name == "siglip":
            assert self.siglip_scale is not None and self.siglip_bias is not None
            with torch.no_grad():
                self.siglip_scale.clamp_(max=math.log(100.0))
            scale = self.siglip_scale.exp()
            loss = (siglip_loss(za, zb, scale, self.siglip_bias) if mask is None
                    else _masked_siglip(scale * (za @ zb.T) + self.siglip_bias, mask & ~eye))
            logs["train/logit_scale"] = float(scale.detach())
            logs["train/logit_bias"] = float(self.siglip_bias.detach())
        elif cfg.name == "supcon":
            has_labels = labels is not None and bool((labels >= 0).all())
            groups = labels if has_labels and labels is not None else index
            loss = supcon_loss(torch.cat([za, zb]), torch.cat([groups, groups]),
                               temperature=cfg.temperature)
        elif cfg.name == "gcl":
            assert self.gcl is not None
            loss = self.gcl(za, zb, index, mask)
            logs["train/gcl_gamma"] = self.gcl.current_gamma
        else:
            loss = self._delta_loss(za @ zb.T, mask, eye)
        return self._regularised(loss, za, zb, logs)

    def rows_mask(self, index: Tensor, labels: Tensor | None, rows: slice
                  ) -> Tensor | TileMask | None:
        """The negatives of the anchors ``index[rows]`` among all of ``index``: the negative
        sets themselves (a :class:`TileMask`, asked by the loss), an ``(h, B)`` bool mask, or
        None for every other member."""
        if self.sets is not None:
            return self.sets
        return self.rows_dense_mask(index, labels, rows)

    def rows_dense_mask(self, index: Tensor, labels: Tensor | None, rows: slice
                        ) -> Tensor | None:
        """:meth:`rows_mask` as an ``(h, B)`` bool mask (or None for every other member)."""
        if self.sets is not None:
            block = densify(self.sets, index[rows], index, max_entries=index.numel() ** 2)
            assert isinstance(block, Tensor)  # always dense under that bound
            return block
        if self.negatives_cfg.exclude_same_label:
            if labels is None or bool((labels < 0).any()):
                raise CrlValueError("negatives.exclude_same_label needs labelled data; the "
                                    "batch has unlabelled items (label -1)")
            return labels[rows].unsqueeze(1) != labels.unsqueeze(0)
        return None

    def local(self, za: Tensor, zb: Tensor, index: Tensor, labels: Tensor | None,
              model: nn.Module, rows: slice) -> tuple[Tensor, dict[str, float]]:
        """This rank's share of the loss of a gathered batch: its anchors ``rows`` against all
        ``B`` columns, with anchor ``i``'s positive at column ``rows.start + i``.

        Every loss is a mean over anchors, so each rank returns ``N`` times its anchors' part
        of that mean (``N`` ranks): the sum of its anchors' terms over the number of anchors
        (with a negative) in the whole batch, which the ranks add up
        (:func:`crl.distributed.all_reduce_sum`; one process: the rank's own count). The mean of
        the ranks' values is then the loss of the global batch and, since the gather's backward
        sums the ranks' gradients, averaging the parameter gradients over ranks gives its
        gradient. GCL updates ``u`` for its rows and all-gathers the new values, so the state
        stays the same on every rank. SupCon (anchors are the two views stacked) and the
        k-means regulariser are computed on the whole batch by every rank, which keeps the same
        mean. With ``loss.block_size`` (or a large batch) the scores are visited in tiles
        (:func:`crl.losses.tiled.anchor_logsumexp`).

        Args:
            za, zb: ``(B, D)`` gathered features, in rank order.
            index: ``(B,)`` gathered dataset indices.
            labels: ``(B,)`` gathered labels or None.
            model: The model (CLIP's ``logit_scale``).
            rows: The rank's contiguous slice of the batch.

        Returns:
            ``(loss, logs)`` as :meth:`forward`.

        Raises:
            CrlValueError: if ``rows`` is not a non-empty slice of the batch.
        """
        cfg = self.cfg
        rows = check_rows("Objective.local", rows, za.shape[0])
        h = rows.stop - rows.start
        world = distributed.world_size()
        logs: dict[str, float] = {}
        total: Tensor
        if cfg.name in ("info_nce", "clip", "gcl"):
            mask = self.rows_mask(index, labels, rows)
            if cfg.name == "gcl":
                assert self.gcl is not None
                total, count = self.gcl.forward_sum(za, zb, index, mask, rows=rows)
                self._share_gcl_state(index, rows)
                logs["train/gcl_gamma"] = self.gcl.current_gamma
            else:
                if cfg.name == "clip":
                    scale = self._logit_scale(model).exp()
                    logs["train/logit_scale"] = float(scale.detach())
                else:
                    scale = za.new_tensor(1.0 / cfg.temperature)
                both = cfg.symmetric or (cfg.name == "clip" and mask is None)
                total, count = self._local_info_nce(za, zb, index, rows, scale, mask, both)
            loss = self._share(total, count, world)
        elif cfg.name == "siglip":
            assert self.siglip_scale is not None and self.siglip_bias is not None
            with torch.no_grad():
                self.siglip_scale.clamp_(max=math.log(100.0))
            scale = self.siglip_scale.exp()
            logits = scale * (za[rows] @ zb.T) + self.siglip_bias  # (h, B)
            own = torch.arange(h, device=za.device)
            negatives = anchor_negatives(self.rows_dense_mask(index, labels, rows), rows,
                                         za.shape[0], za.device)
            loss = -(F.logsigmoid(logits[own, own + rows.start]).sum()
                     + (F.logsigmoid(-logits) * negatives).sum()) / h
            logs["train/logit_scale"] = float(scale.detach())
            logs["train/logit_bias"] = float(self.siglip_bias.detach())
        elif cfg.name == "supcon":
            loss, logs = self.forward(za, zb, index, labels, model)
            return loss, logs  # every rank: the whole batch's loss (regulariser included)
        else:
            total, count = self._local_delta_loss(za, zb, rows,
                                                  self.rows_dense_mask(index, labels, rows))
            loss = self._share(total, count, world)
        return self._regularised(loss, za, zb, logs)

    @staticmethod
    def _share(total: Tensor, count: int, world: int) -> Tensor:
        """``world * total / (count summed over ranks)``: this rank's share of a mean over the
        anchors of the global batch (0 with a working graph when no anchor counts)."""
        counts = distributed.all_reduce_sum(torch.tensor([count], dtype=torch.int64,
                                                         device=total.device))
        return total * (world / max(int(counts.item()), 1))

    def _share_gcl_state(self, index: Tensor, rows: slice) -> None:
        """Give every rank the ``u`` that each rank just updated for its own rows."""
        assert self.gcl is not None
        if not distributed.is_active() or distributed.world_size() == 1:
            return
        for state in (self.gcl.log_u_a2b, self.gcl.log_u_b2a):
            where = index.to(state.device)
            state[where] = distributed.all_gather_tensor(state[where[rows]])

    def _local_info_nce(self, za: Tensor, zb: Tensor, index: Tensor, rows: slice, scale: Tensor,
                        mask: Tensor | TileMask | None, both: bool) -> tuple[Tensor, int]:
        """The sum of InfoNCE over the anchors ``rows`` that have a negative (averaged over the
        directions when ``both``), and their number."""
        total = za.new_zeros(())
        count = 0
        if mask is not None and not isinstance(mask, Tensor):
            mask = densify(mask, index[rows], index)  # once for both directions and backward
        directions = [(za, zb), (zb, za)] if both else [(za, zb)]
        for x, y in directions:
            # The sample-indexed mask serves both directions: row i lists sample i's negatives.
            out = anchor_logsumexp(x[rows], y, scale, offset=rows.start, negatives_mask=mask,
                                   anchor_index=index[rows], candidate_index=index,
                                   block_size=self.cfg.block_size)
            has = out.counts > 1  # the positive plus at least one negative
            total = total + (out.lse - out.positive)[has].sum()
            count = int(has.sum())
        return total / len(directions), count

    def _local_delta_loss(self, za: Tensor, zb: Tensor, rows: slice,
                          mask: Tensor | None) -> tuple[Tensor, int]:
        """:meth:`_delta_loss` of the anchors ``rows``: the sum over those with a negative (mean
        over directions) and their number."""
        own = torch.arange(rows.stop - rows.start, device=za.device)
        negatives = anchor_negatives(mask, rows, za.shape[0], za.device)
        has = negatives.any(dim=1)
        count = int(has.sum())
        if count == 0:
            return za.sum() * 0.0 + zb.sum() * 0.0, 0
        directions = [(za, zb), (zb, za)] if self.cfg.symmetric else [(za, zb)]
        total = za.new_zeros(())
        for x, y in directions:
            s = x[rows] @ y.T  # (h, B)
            delta = (s - s[own, own + rows.start].unsqueeze(1))[has]
            if self.cfg.name == "oce":
                mean = oce_risk(delta, phi=self.cfg.oce.phi, temperature=self.cfg.temperature,
                                alpha=self.cfg.oce.alpha, mask=negatives[has])
            else:
                mean = pairwise_risk(delta, loss=self.cfg.pairwise_loss, mask=negatives[has])
            total = total + mean * count
        return total / len(directions), count

    def _regularised(self, loss: Tensor, za: Tensor, zb: Tensor, logs: dict[str, float]
                     ) -> tuple[Tensor, dict[str, float]]:
        """Add the relaxed k-means regulariser when ``kmeans_weight > 0``."""
        if self.cfg.kmeans_weight > 0:
            k = min(self.kmeans_k, za.shape[1])
            regulariser = 0.5 * (relaxed_kmeans(za, k) + relaxed_kmeans(zb, k))
            logs["train/relaxed_kmeans"] = float(regulariser.detach())
            loss = loss + self.cfg.kmeans_weight * regulariser
        return loss, logs

    def _info_nce(self, logits: Tensor, mask: Tensor | None, eye: Tensor) -> Tensor:
        """Mean InfoNCE over the anchors that have a negative, in one or both directions."""
        negatives = ~eye if mask is None else mask & ~eye
        has = negatives.any(dim=1)
        if not bool(has.any()):
            return logits.sum() * 0.0
        loss = masked_info_nce_rows(logits, negatives)[has].mean()
        if self.cfg.symmetric:
            # The same mask serves the b -> a direction: row i lists sample i's negatives.
            loss = 0.5 * (loss + masked_info_nce_rows(logits.T, negatives)[has].mean())
        return loss

    def _delta_loss(self, scores: Tensor, mask: Tensor | None, eye: Tensor) -> Tensor:
        """OCE or pairwise risk of ``Delta_ij = s_ij - s_ii`` over each anchor's negatives."""
        negatives = ~eye if mask is None else mask & ~eye
        has = negatives.any(dim=1)
        if not bool(has.any()):
            return scores.sum() * 0.0
        directions = [scores, scores.T] if self.cfg.symmetric else [scores]
        total = scores.new_zeros(())
        for s in directions:
            delta = (s - s.diagonal().unsqueeze(1))[has]
            if self.cfg.name == "oce":
                total = total + oce_risk(delta, phi=self.cfg.oce.phi,
                                         temperature=self.cfg.temperature,
                                         alpha=self.cfg.oce.alpha, mask=negatives[has])
            else:
                total = total + pairwise_risk(delta, loss=self.cfg.pairwise_loss,
                                              mask=negatives[has])
        return total / len(directions)


__all__ = ["Objective", "masked_info_nce_rows"]
