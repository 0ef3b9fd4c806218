"""Monte Carlo estimates of the risk ``L(s)`` and the AUC ``E(s)`` of any scorer, and the MI bound.

The exact answers live on the models (:mod:`crl.theory.models`); these estimators work for any
scorer callable ``scorer(x, y) -> (N,)`` and report a standard error.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from crl._validation import check_int_range, check_positive, describe
from crl.errors import CrlTypeError, CrlValueError
from crl.theory.models import ExactModel, Scorer, TableScorer, TabularModel


@dataclass(frozen=True)
class MonteCarloEstimate:
    """A Monte Carlo estimate: ``value`` with standard error ``stderr`` from ``num_samples``."""

    value: float
    stderr: float
    num_samples: int

    def contains(self, target: float, num_stderr: float = 4.0) -> bool:
        """True when ``|value - target| <= num_stderr * stderr``."""
        return abs(self.value - target) <= num_stderr * self.stderr


def as_scorer(model: ExactModel, scorer: Any) -> Scorer:
    """``scorer`` as a callable; a score table is accepted for a :class:`TabularModel`."""
    if isinstance(model, TabularModel) and not callable(scorer):
        return TableScorer(model.table_of(scorer))
    if not callable(scorer):
        raise CrlTypeError(f"{type(model).__name__}: `scorer` must be a callable "
                           f"scorer(x, y) -> (N,); got {describe(scorer)}")
    return scorer  # type: ignore[no-any-return]


def score_negatives(scorer: Scorer, x: Tensor, negatives: Tensor, *, shared: bool) -> Tensor:
    """Scores ``s(x_i, y'_ij)`` as a ``(N, M)`` tensor.

    Args:
        scorer: ``scorer(x, y) -> (N,)``.
        x: Anchors, ``(N, ...)``.
        negatives: ``(N, M, ...)`` independent negatives, or ``(M, ...)`` shared ones.
        shared: Which of the two layouts ``negatives`` has.

    Example:
        >>> dot = lambda x, y: (x * y).sum(-1)
        >>> score_negatives(dot, torch.eye(2), torch.eye(2), shared=True).tolist()
        [[1.0, 0.0], [0.0, 1.0]]
    """
    n = x.shape[0]
    if shared:
        negatives = negatives.unsqueeze(0).expand(n, *negatives.shape)
    if negatives.shape[0] != n:
        raise CrlValueError(f"score_negatives: independent `negatives` must have shape "
                            f"(N={n}, M, ...); got {tuple(negatives.shape)}")
    m = negatives.shape[1]
    xs = x.unsqueeze(1).expand(n, m, *x.shape[1:]).reshape(n * m, *x.shape[1:])
    ys = negatives.reshape(n * m, *negatives.shape[2:])
    return scorer(xs, ys).reshape(n, m)


def anchor_empirical_risk(positive_scores: Tensor, negative_scores: Tensor,
                          tau: float) -> Tensor:
    """Per-anchor empirical contrastive risk (positive excluded; docs/theory.md §1 and §8).

    ``tau log( (1/M) sum_j exp((s(x_i, y'_ij) - s(x_i, y_i)) / tau) )``.

    Args:
        positive_scores: ``(N,)``.
        negative_scores: ``(N, M)``.
        tau: Temperature.

    Returns:
        ``(N,)``.

    Example:
        >>> anchor_empirical_risk(torch.zeros(1), torch.zeros(1, 3), 1.0).tolist()
        [0.0]
    """
    delta = (negative_scores - positive_scores.unsqueeze(1)) / tau  # (N, M)
    return tau * (torch.logsumexp(delta, dim=1) - math.log(delta.shape[1]))


def mc_risk(model: ExactModel, scorer: Any, tau: float, *, num_anchors: int = 20_000,
            num_negatives: int = 2_000, generator: torch.Generator | None = None,
            bias_correction: bool = True, chunk: int = 2_000_000) -> MonteCarloEstimate:
    """Nested Monte Carlo estimate of the population risk ``L(s)`` (docs/theory.md §1).

    Each anchor gets ``num_negatives`` independent negatives; the log of their mean is biased by
    about ``-tau Var(e^{D/tau}) / (2 M mean^2)`` (docs/theory.md §5), which
    ``bias_correction`` adds back per anchor (leaving an ``O(1/M^2)`` bias). The standard error is
    that of the mean over anchors.

    Example:
        >>> from crl.theory.latent import LatentClassModel
        >>> model = LatentClassModel([0.5, 0.5])
        >>> est = mc_risk(model, model.optimal_table(1.0), 1.0, num_anchors=2000,
        ...               num_negatives=200, generator=torch.Generator().manual_seed(0))
        >>> est.contains(model.optimal_risk(1.0))
        True
    """
    where = "mc_risk"
    check_positive(where, "tau", tau, allow_tensor=False)
    check_int_range(where, "num_anchors", num_anchors, 2, None)
    check_int_range(where, "num_negatives", num_negatives, 2, None)
    values = []
    for pos, scores in _sampled_scores(model, as_scorer(model, scorer), num_anchors,
                                       num_negatives, generator, chunk):
        pos, scores = pos.to(torch.float64), scores.to(torch.float64)
        per_anchor = anchor_empirical_risk(pos, scores, tau)
        if bias_correction:
            w = torch.exp((scores - pos.unsqueeze(1)) / tau - per_anchor.unsqueeze(1) / tau)
            # w has mean 1 per row: the correction is tau Var(w) / (2 M).
            per_anchor = per_anchor + tau * w.var(dim=1) / (2 * num_negatives)
        values.append(per_anchor)
    return _mean_estimate(torch.cat(values))


def mc_auc(model: ExactModel, scorer: Any, *, num_anchors: int = 20_000,
           num_negatives: int = 64, generator: torch.Generator | None = None,
           chunk: int = 2_000_000) -> MonteCarloEstimate:
    """Unbiased Monte Carlo estimate of the AUC criterion ``E(s)`` (docs/theory.md §1).

    Per anchor: the fraction of its ``num_negatives`` negatives ranked below its positive (ties
    count 1/2); the estimate is the mean over anchors, its standard error that of the mean.

    Example:
        >>> from crl.theory.latent import LatentClassModel
        >>> model = LatentClassModel([0.5, 0.5])
        >>> est = mc_auc(model, model.optimal_table(1.0), num_anchors=2000,
        ...              generator=torch.Generator().manual_seed(0))
        >>> est.contains(model.optimal_auc())
        True
    """
    where = "mc_auc"
    check_int_range(where, "num_anchors", num_anchors, 2, None)
    check_int_range(where, "num_negatives", num_negatives, 1, None)
    values = []
    for pos, scores in _sampled_scores(model, as_scorer(model, scorer), num_anchors,
                                       num_negatives, generator, chunk):
        pos = pos.unsqueeze(1)
        values.append(((pos > scores).double() + 0.5 * (pos == scores).double()).mean(dim=1))
    return _mean_estimate(torch.cat(values))


def _sampled_scores(model: ExactModel, fn: Scorer, num_anchors: int, num_negatives: int,
                    generator: torch.Generator | None, chunk: int
                    ) -> Iterator[tuple[Tensor, Tensor]]:
    """Fresh anchors with their positive scores ``(k,)`` and independent negative scores
    ``(k, num_negatives)``, in chunks of about ``chunk`` scores, ``num_anchors`` in all."""
    step = max(1, chunk // num_negatives)
    done = 0
    while done < num_anchors:
        k = min(step, num_anchors - done)
        x, y = model.sample(k, generator)
        neg = model.sample_negatives(x, num_negatives, generator)
        yield fn(x, y), score_negatives(fn, x, neg, shared=False)
        done += k


def _mean_estimate(values: Tensor) -> MonteCarloEstimate:
    n = values.shape[0]
    return MonteCarloEstimate(float(values.mean()), float(values.std() / math.sqrt(n)), n)


def mi_lower_bound(info_nce_value: float, num_candidates: int) -> float:
    """``I(x; y) >= log K - L_InfoNCE`` for InfoNCE with ``K`` candidates (docs/theory.md §3).

    Args:
        info_nce_value: The InfoNCE loss (positive included in the denominator), in nats.
        num_candidates: ``K``, the positive plus the negatives.

    Example:
        >>> round(mi_lower_bound(1.0, 8), 4)  # log 8 - 1
        1.0794
    """
    where = "mi_lower_bound"
    check_int_range(where, "num_candidates", num_candidates, 1, None)
    if isinstance(info_nce_value, bool) or not isinstance(info_nce_value, (int, float)) \
            or not math.isfinite(info_nce_value):
        raise CrlValueError(f"{where}: `info_nce_value` must be a finite number; got "
                            f"{describe(info_nce_value)}")
    return math.log(num_candidates) - float(info_nce_value)
