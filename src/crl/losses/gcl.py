"""The global contrastive loss (SogCLR / FastCLIP estimator; docs/theory.md §10).

The mini-batch contrastive risk ``tau log(mean_{j in batch} exp(Delta_ij / tau))`` is biased
because the batch mean sits inside the log. GCL keeps, per sample and direction, a running
estimate ``u_i`` of the anchor's full inner mean ``g_i = mean_{j in S_i} exp(Delta_ij / tau)`` and
differentiates the surrogate ``tau * g_hat_i / u_i`` (``u`` detached), whose gradient
``tau * grad(g_hat_i) / u_i`` estimates ``grad(tau log g_i)`` with a bias that vanishes as ``u``
tracks ``g``, whatever the batch size. See ``docs/negatives.md`` for the estimator when the
number of in-batch negatives varies per anchor.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from crl import distributed
from crl._validation import (
    check_hard,
    check_index,
    check_int_range,
    check_mask,
    check_pair,
    check_positive,
    check_rows,
    compute_dtype,
    describe,
    upcast,
)
from crl.errors import CrlTypeError
from crl.losses._common import anchor_negatives, expand_counted, hard_scores, masked_logsumexp
from crl.losses._gcl_schedule import check_gamma_schedule, cosine_gamma
from crl.losses._gcl_temperature import temperature_strategy
from crl.losses.base import (
    AnchorTerms,
    LossContext,
    PairBatch,
    PairLoss,
    reduce_terms,
)
from crl.losses.tiled import (
    BlockSize,
    TileMask,
    Tiles,
    anchor_logsumexp,
    check_block_size,
    decide_tiles,
    densify,
)

if TYPE_CHECKING:
    from crl.losses.config import LossConfig

GammaSchedule = Literal["constant", "cosine"]
TemperatureMode = Literal["fixed", "global_learnable", "per_sample"]
_WHERE = "GlobalContrastiveLoss"


class GlobalContrastiveLoss(PairLoss):
    """GCL with a per-sample, per-direction running estimate of the inner mean (SogCLR/FastCLIP).

    For anchor ``i`` of direction ``a -> b`` (and ``b -> a`` with ``a``, ``b`` swapped) with
    in-batch negatives ``N_i = {j : negatives_mask[i, j]}``:

    - ``g_hat_i = mean_{j in N_i} exp((s_ij - s_ii) / tau)`` with ``s = a @ b.T``;
    - ``u_i <- (1 - gamma) u_i + gamma g_hat_i``, or ``u_i <- g_hat_i`` on a first visit or a
      non-finite ``u_i``; kept as ``log u`` (float64 buffers ``log_u_a2b`` / ``log_u_b2a`` of
      shape ``(num_samples,)``, NaN before a sample's first visit, saved in ``state_dict``);
    - loss ``tau * mean_i g_hat_i / u_i`` with ``u`` detached after the update, averaged over the
      two directions when ``symmetric``.

    With ``include_positive`` the positive is one of the anchor's candidates (``exp(0) = 1``
    enters the mean, and the count): for ``k_i`` batch negatives ``u_i`` then tracks
    ``(1 + k_i gbar_i) / (1 + k_i)`` with ``gbar_i`` the mean over the whole negative set, so GCL
    optimises InfoNCE with ``k_i`` negatives without its mini-batch bias, and a first visit
    gives exactly ``tau`` times InfoNCE's gradient, where the default (positive-excluded) gives
    the decoupled loss's (docs/theory.md §10).

    Anchors with no in-batch negative contribute nothing and keep their ``u``; the mean runs over
    the anchors that have one. Hard negatives (``hard (B, H, D)``, view b) are further negatives
    of their anchor only, in the ``a -> b`` direction: they enter its inner mean ``g_hat_i`` and
    its count; an anchor with hard negatives always counts (in the ``b -> a`` direction it
    contributes only when it has an in-batch negative). Because ``log u_i >= log gamma +
    log g_hat_i`` after the update, ``g_hat_i / u_i <= 1 / gamma``: the loss stays finite at
    any temperature.

    The negatives mask is indexed by sample: ``negatives_mask[i, j]`` says sample ``j`` is a
    negative of sample ``i``, and the same mask serves both directions (``b[i]``'s negatives are
    the ``a[j]`` with ``negatives_mask[i, j]``), as :meth:`crl.negatives.NegativeSets.batch_mask`
    gives it. (``info_nce(symmetric=True)`` instead transposes the mask for the second direction.)

    Temperature modes (docs/theory.md §10): ``"fixed"`` (a float64 0-dim buffer
    ``temperature``), ``"global_learnable"`` (a 0-dim parameter; per anchor the objective
    ``tau (log g + rho)``, FastCLIP-v3) and ``"per_sample"`` (parameter ``temperature`` of shape
    ``(2, num_samples)``, row 0 for ``a -> b``, iSogCLR).

    Learnable temperatures are clamped to ``>= min_temperature`` before every call
    ``loss(a, b, index)`` and, in training, by :meth:`after_step`.

    Args:
        num_samples: Dataset size ``N``; ``index`` values lie in ``[0, N)``.
        temperature: Initial (or fixed) ``tau > 0``.
        gamma: Moving-average weight of the new estimate, in ``(0, 1]`` (``"constant"`` schedule).
        gamma_schedule: ``"constant"`` or ``"cosine"`` (from 1 to ``gamma_min`` over
            ``decay_epochs`` epochs, driven by :meth:`set_epoch`).
        gamma_min: Final gamma of the cosine schedule, in ``(0, 1]``.
        decay_epochs: Epochs of the cosine decay (required for ``"cosine"``).
        symmetric: Average the ``a -> b`` and ``b -> a`` directions.
        include_positive: Count the positive among each anchor's candidates (above).
        temperature_mode: ``"fixed"``, ``"global_learnable"`` or ``"per_sample"``.
        rho: The KL-radius term of the learnable-temperature objective (``tau * rho`` is added).
        min_temperature: Lower clamp of learnable temperatures.
        block_size: An int: tiles of this side (:func:`crl.losses.tiled.anchor_logsumexp`):
            memory ``O(B·D + T²)``, the same values and gradients; a
            :class:`~crl.losses.tiled.TileMask` is then asked tile by tile, so no ``(B, B)`` mask
            is built. None: tiles above ``PLAIN_MAX_BATCH`` only; ``"plain"``: never.

    Example:
        >>> loss = GlobalContrastiveLoss(num_samples=10, temperature=1.0)
        >>> a = torch.eye(3)
        >>> float(loss(a, a, torch.tensor([0, 4, 7])))  # first visit: u = g_hat, ratio 1
        1.0
        >>> bool(torch.isnan(loss.log_u_a2b[1])), round(float(loss.log_u_a2b[0]), 4)
        (True, -1.0)
    """

    accepts_hard_negatives = True
    accepts_guide = True
    tiled_path = True
    log_u_a2b: Tensor
    log_u_b2a: Tensor
    epoch: Tensor
    temperature: Tensor

    def __init__(
        self,
        num_samples: int,
        *,
        temperature: float = 0.07,
        gamma: float = 0.9,
        gamma_schedule: GammaSchedule = "constant",
        gamma_min: float = 0.2,
        decay_epochs: int | None = None,
        symmetric: bool = True,
        include_positive: bool = False,
        temperature_mode: TemperatureMode = "fixed",
        rho: float = 6.5,
        min_temperature: float = 1e-3,
        block_size: BlockSize = None,
    ) -> None:
        super().__init__()
        self.block_size = check_block_size(_WHERE, block_size)
        self.num_samples = check_int_range(_WHERE, "num_samples", num_samples, 1, None)
        check_positive(_WHERE, "temperature", temperature, allow_tensor=False)
        self.gamma_schedule = check_gamma_schedule(_WHERE, gamma_schedule, gamma, gamma_min,
                                                   decay_epochs)
        if not isinstance(include_positive, bool):
            raise CrlTypeError(f"{_WHERE}: `include_positive` must be a bool; got "
                               f"{describe(include_positive)}")
        # The temperature mode, chosen once: how tau is held, used, clamped and reported.
        self.temperature_strategy = temperature_strategy(_WHERE, temperature_mode, rho=rho,
                                                         min_temperature=min_temperature)
        self.temperature_mode = self.temperature_strategy.mode
        self.gamma, self.gamma_min, self.decay_epochs = float(gamma), float(gamma_min), decay_epochs
        self.symmetric = bool(symmetric)
        self.include_positive = include_positive
        nan = torch.full((self.num_samples,), math.nan, dtype=torch.float64)
        self.register_buffer("log_u_a2b", nan.clone())
        self.register_buffer("log_u_b2a", nan.clone())
        self.register_buffer("epoch", torch.tensor(0, dtype=torch.int64))
        self.temperature_strategy.attach(self, temperature, self.num_samples)  # after the buffers

    @classmethod
    def from_config(cls, cfg: LossConfig, ctx: LossContext) -> GlobalContrastiveLoss:
        g = cfg.gcl
        decay = (g.decay_epochs or ctx.epochs or 1) if g.gamma_schedule == "cosine" else None
        return cls(ctx.num_samples, temperature=cfg.temperature, gamma=g.gamma,
                   gamma_schedule=g.gamma_schedule, gamma_min=g.gamma_min, decay_epochs=decay,
                   symmetric=cfg.symmetric, include_positive=g.include_positive,
                   temperature_mode=g.temperature_mode, rho=g.rho, block_size=cfg.block_size)

    @property
    def current_gamma(self) -> float:
        """The gamma used by the next update (from the schedule and :meth:`set_epoch`)."""
        if self.gamma_schedule == "constant" or self.decay_epochs is None:
            return self.gamma
        return cosine_gamma(int(self.epoch), self.decay_epochs, self.gamma_min)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch that drives the gamma schedule (stored in ``state_dict``)."""
        check_int_range(f"{_WHERE}.set_epoch", "epoch", epoch, 0, None)
        self.epoch.fill_(epoch)

    def reset_state(self) -> None:
        """Forget every estimate (all samples become unvisited)."""
        self.log_u_a2b.fill_(math.nan)
        self.log_u_b2a.fill_(math.nan)

    def extra_repr(self) -> str:
        return (f"num_samples={self.num_samples}, temperature_mode={self.temperature_mode!r}, "
                f"gamma={self.gamma}, gamma_schedule={self.gamma_schedule!r}, "
                f"symmetric={self.symmetric}, include_positive={self.include_positive}")

    def _update(self, state: Tensor, index: Tensor, log_g_hat: Tensor) -> Tensor:
        """Write the moving average of ``log_g_hat (A,)`` into ``state[index]``; return log u."""
        idx = index.to(state.device)
        new_log = log_g_hat.detach().to(torch.float64).to(state.device)
        gamma = self.current_gamma
        if gamma < 1.0:
            old = state[idx].to(torch.float64)
            mixed = torch.logaddexp(math.log1p(-gamma) + old, math.log(gamma) + new_log)
            new_log = torch.where(torch.isfinite(old) & torch.isfinite(mixed), mixed, new_log)
        state[idx] = new_log.to(state.dtype)
        return new_log.to(device=log_g_hat.device, dtype=log_g_hat.dtype)

    def _direction(self, x: Tensor, y: Tensor, mask: Tensor | TileMask | None, index: Tensor,
                   rows: slice, tau: Tensor, state: Tensor, extra: Tensor | None, tiles: Tiles,
                   extra_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """One direction for the anchors ``x[rows]`` against all candidates ``y (B, D)`` (and
        their own ``extra (h, H, D)``): ``(tau g_hat / u of the anchors with a negative (A,),
        which anchors those are (h,) bool)``; ``mask`` is the ``(h, B)`` rows' mask, a
        :class:`TileMask` or None; ``tau`` is 0-dim or ``(B,)``; ``tiles`` the batch's;
        ``extra_mask (h, H)`` which extra candidates count (None: all)."""
        h, batch = rows.stop - rows.start, y.shape[0]
        tau_rows = tau if tau.dim() == 0 else tau[rows]  # () or (h,)
        if tiles == "plain":
            # Plain: Delta_ij = (s_ij - s_ii) / tau first, so a first visit with one negative
            # gives log u_i = Delta_ij exactly.
            if mask is not None and not isinstance(mask, Tensor):
                mask = mask.mask(index[rows], index)
            negatives = anchor_negatives(mask, rows, batch, x.device)
            counted = (negatives.any(dim=1) if extra is None
                       else torch.ones(h, dtype=torch.bool, device=x.device) if extra_mask is None
                       else negatives.any(dim=1) | extra_mask.any(dim=1))
            has = counted.nonzero().squeeze(1)  # (A,) local anchors with a negative
            if has.numel() == 0:
                return self._nothing(x, y, tau).expand(0), counted
            anchors = x[rows][has]  # (A, D)
            s = anchors @ y.T  # (A, B)
            positive = s.gather(1, (has + rows.start).unsqueeze(1))  # (A, 1): s_ii
            tau_a = tau_rows if tau_rows.dim() == 0 else tau_rows[has].unsqueeze(1)
            delta = (s - positive) / tau_a  # (A, B)
            allowed = negatives[has]
            if self.include_positive:  # Delta_ii = 0: the positive adds exp(0) = 1
                allowed = allowed.clone()
                allowed[torch.arange(has.numel(), device=x.device), has + rows.start] = True
            count = allowed.sum(dim=1).to(delta.dtype)
            if extra is not None:  # anchor i's own hard negatives: (A, H) more columns
                delta = torch.cat([delta, (hard_scores(anchors, extra[has]) - positive) / tau_a],
                                  dim=1)
                kept = (allowed.new_ones(has.numel(), extra.shape[1]) if extra_mask is None
                        else extra_mask[has])
                allowed = torch.cat([allowed, kept], dim=1)
                count = count + kept.sum(dim=1).to(count.dtype)
            log_g_hat = masked_logsumexp(delta, allowed, dim=1) - torch.log(count)
        else:
            out = anchor_logsumexp(x[rows], y, 1.0 / tau_rows, offset=rows.start,
                                   include_positive=self.include_positive, negatives_mask=mask,
                                   anchor_index=index[rows], candidate_index=index,
                                   block_size=tiles, extra=extra, check=False,
                                   extra_mask=extra_mask)
            counted = out.counts > int(self.include_positive)  # at least one negative
            has = counted.nonzero().squeeze(1)  # (A,) local anchors with a negative
            if has.numel() == 0:
                return self._nothing(x, y, tau).expand(0), counted
            count = out.counts[has].to(out.lse.dtype)
            log_g_hat = out.lse[has] - out.positive[has] - torch.log(count)  # (A,)
        return self._surrogate(rows.start + has, log_g_hat, index, tau, state), counted

    @staticmethod
    def _nothing(x: Tensor, y: Tensor, tau: Tensor) -> Tensor:
        """Nothing to estimate: a zero that keeps the graph so backward() still works."""
        return x.sum() * 0.0 + y.sum() * 0.0 + tau.sum() * 0.0

    def _surrogate(self, rows: Tensor, log_g_hat: Tensor, index: Tensor, tau: Tensor,
                   state: Tensor) -> Tensor:
        """Update ``u`` of the anchors ``rows`` (batch positions) and return
        ``tau * g_hat / u`` of each ``(A,)``."""
        log_u = self._update(state, index[rows], log_g_hat)  # (A,), detached
        ratio = torch.exp(log_g_hat - log_u)  # g_hat / u <= 1 / gamma
        tau_a = tau if tau.dim() == 0 else tau[rows]  # () or (A,)
        return self.temperature_strategy.surrogate(tau_a, ratio, log_u)

    def forward(self, a: Tensor, b: Tensor, index: Tensor,
                negatives_mask: Tensor | TileMask | None = None, *,
                rows: slice | None = None, hard: Tensor | None = None) -> Tensor:
        """The GCL surrogate of a batch; updates the ``u`` estimates of the batch's samples.

        Args:
            a: View-a embeddings ``(B, D)`` (the whole, possibly all-gathered, batch).
            b: View-b embeddings ``(B, D)``; ``b[i]`` is the positive of ``a[i]``.
            index: ``(B,)`` distinct dataset indices of the samples, in ``[0, num_samples)``.
            negatives_mask: Optional ``(B, B)`` bool, ``[i, j]`` True where sample ``j`` is a
                negative of sample ``i`` (both directions; the diagonal is ignored), or a
                :class:`~crl.losses.tiled.TileMask` asked with ``index``. Default every
                ``j != i``. Rows may be empty: those anchors are skipped.
            rows: Score and update only the anchors ``rows`` (a contiguous ``slice``) against
                all ``B`` candidates; ``negatives_mask`` may then be their ``(h, B)`` mask.
            hard: Optional ``(B, H, D)`` hard negatives of each anchor (view b).

        Returns:
            0-dim tensor: the mean over the (selected) anchors that have a negative (0 with a
            working graph when none has); under ``torchrun``, :func:`crl.losses.build_objective`.

        Raises:
            CrlValueError / CrlTypeError: on bad shapes, NaN inputs, indices out of range or
                repeated, a mask of the wrong shape or dtype, a bad ``rows`` or ``hard``.
        """
        a, b = check_pair(_WHERE, a, b)
        dtype = compute_dtype(a, b)
        a, b = upcast(a, dtype), upcast(b, dtype)
        batch = a.shape[0]
        index = check_index(_WHERE, "index", index, length=batch, num_samples=self.num_samples,
                            distinct=True).to(a.device)
        rows = check_rows(_WHERE, rows, batch)
        h = rows.stop - rows.start
        mask: Tensor | TileMask | None = negatives_mask
        if isinstance(negatives_mask, Tensor):
            if tuple(negatives_mask.shape) == (h, batch):
                mask = check_mask(_WHERE, "negatives_mask", negatives_mask, (h, batch),
                                  need_true_per_row=False)
            else:
                mask = check_mask(_WHERE, "negatives_mask", negatives_mask, (batch, batch),
                                  need_true_per_row=False)[rows]
            mask = mask.to(a.device)
        elif negatives_mask is not None:
            if not isinstance(negatives_mask, TileMask):
                raise CrlTypeError(f"{_WHERE}: `negatives_mask` must be None, a (B, B) bool "
                                   f"tensor or a TileMask; got {describe(negatives_mask)}")
            # Asked once for both directions and the backward pass when the block is not huge.
            mask = densify(negatives_mask, index[rows], index)
        if hard is not None:
            hard = upcast(check_hard(_WHERE, hard, a), dtype)
        self.temperature_strategy.clamp_if_below_(self.temperature)
        tiles = decide_tiles(_WHERE, self.block_size, h, batch)
        return reduce_terms(self.terms(PairBatch(a, b, index, None, rows, mask, hard, tiles),
                                       share_state=False), world=1)

    def terms(self, batch: PairBatch, *, share_state: bool = True) -> AnchorTerms:
        """Per-anchor surrogates of ``batch.rows``; updates their ``u`` and, under ``torchrun``
        with ``share_state``, gives every rank the ``u`` each rank updated. No checks."""
        dtype = compute_dtype(batch.za, batch.zb)
        a, b = batch.za, batch.zb  # bfloat16 stays so for the tiled kernel
        hard = batch.hard_rows()
        if batch.tiles == "plain":
            a, b = upcast(a, dtype), upcast(b, dtype)
            hard = None if hard is None else upcast(hard, dtype)
        index, rows = batch.index, batch.rows
        # The same sample-indexed mask serves both directions, hence (b, a) in the second.
        first, counted = self._direction(a, b, batch.negatives, index, rows,
                                         self._tau(0, index, dtype), self.log_u_a2b, hard,
                                         batch.tiles, batch.hard_mask_rows())
        values = [expand_counted(first, counted, batch.size)]
        if self.symmetric:
            other, other_counted = self._direction(b, a, batch.negatives, index, rows,
                                                   self._tau(1, index, dtype), self.log_u_b2a,
                                                   None, batch.tiles)
            values.append(expand_counted(other, other_counted, batch.size))
        if share_state and not batch.whole and distributed.is_active() \
                and distributed.world_size() > 1:  # each rank updated its own rows
            for state in (self.log_u_a2b, self.log_u_b2a):
                where = index.to(state.device)
                state[where] = distributed.all_gather_tensor(state[where[rows]])
        return AnchorTerms(tuple(values), counted)

    def after_step(self) -> None:  # learnable temperatures >= min_temperature
        self.temperature_strategy.clamp_(self.temperature)

    def logs(self) -> dict[str, float]:
        return {"train/gcl_gamma": self.current_gamma}

    def risk_temperature(self) -> float:
        return self.temperature_strategy.risk_temperature(self.temperature)

    def _tau(self, direction: int, index: Tensor, dtype: torch.dtype) -> Tensor:
        """The temperature of a direction: 0-dim, or ``(B,)`` in the per-sample mode."""
        return self.temperature_strategy.of_batch(self.temperature, direction, index, dtype)


__all__ = ["GammaSchedule", "GlobalContrastiveLoss", "TemperatureMode", "cosine_gamma"]
