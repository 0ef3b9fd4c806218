"""Inner (finite m) and outer (finite n) error of the empirical contrastive risk
(docs/theory.md §5).

For a fixed scorer, one repetition draws ``n`` anchors with their positives, then ``m`` negatives
per anchor (independent, SCRL) or one set of ``m`` for all anchors (shared, SSCRL), and computes
the empirical risk ``L_hat = (1/n) sum_i tau log( (1/m) sum_j exp(Delta_ij / tau) )``. With
``L_n = (1/n) sum_i tau log E_{y'~p-} exp(Delta(x_i, y_i, y')/tau)`` (the same anchors, infinitely
many negatives, computed exactly by the model) and ``L`` the exact population risk:

- **inner error** of a repetition: ``L_n - L_hat`` (the error due to finite ``m``, given the
  anchors);
- **outer error**: ``L - L_n`` (the error due to finite ``n``);

so ``L - L_hat = inner + outer``. Over repetitions we report the mean and the root-mean-square of
each. With ``n >> m``, the inner RMS is dominated by the bias ``~ tau Var / (2 m mean^2)`` for
independent negatives (so it falls like ``1/m``: the fluctuations average over the ``n``
anchors), and by the fluctuation of the one shared sample for shared negatives (``~ 1/sqrt(m)``:
it does not average out). The paper's split ``(L - E L_hat) + (E L_hat - L_hat)`` is reported as
well (docs/theory.md §5): ``expected_gap`` estimates ``L - E L_hat`` and ``fluctuation_rms``
the RMS of ``E L_hat - L_hat`` (both over the repetitions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats

from crl._validation import check_int_range, check_positive, describe
from crl.errors import CrlValueError
from crl.theory.estimators import anchor_empirical_risk, as_scorer, score_negatives
from crl.theory.models import ExactModel


@dataclass(frozen=True)
class InnerOuterError:
    """Inner and outer error of the empirical risk over repeated samples (see module docstring).

    Attributes:
        n: Anchors per sample.
        m: Negatives per anchor.
        shared: True for one shared negative set (SSCRL), False for independent ones (SCRL).
        repetitions: Number of repetitions.
        population_risk: The exact ``L``.
        mean_empirical_risk: The mean of ``L_hat`` over repetitions.
        inner_mean: Mean of ``L_n - L_hat`` (estimates the finite-m bias, >= 0 by Jensen).
        inner_stderr: Standard error of ``inner_mean``.
        inner_rms: Root-mean-square of ``L_n - L_hat``.
        outer_mean: Mean of ``L - L_n`` (about 0).
        outer_rms: Root-mean-square of ``L - L_n`` (about ``sd / sqrt(n)``).
        expected_gap: ``L - mean(L_hat)``, the estimate of the paper's ``L - E L_hat``.
        expected_gap_stderr: Its standard error.
        fluctuation_rms: RMS of ``mean(L_hat) - L_hat``, the paper's ``E L_hat - L_hat``.
    """

    n: int
    m: int
    shared: bool
    repetitions: int
    population_risk: float
    mean_empirical_risk: float
    inner_mean: float
    inner_stderr: float
    inner_rms: float
    outer_mean: float
    outer_rms: float
    expected_gap: float
    expected_gap_stderr: float
    fluctuation_rms: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return asdict(self)


def inner_outer_error(model: ExactModel, scorer: Any, tau: float, *, n: int, m: int,
                      shared: bool, repetitions: int = 50,
                      generator: torch.Generator | None = None) -> InnerOuterError:
    """Estimate the inner and outer error of ``scorer`` by repeated sampling (docs/theory.md §5).

    Args:
        model: A model with an exact ``anchor_risk`` for this scorer (tabular + score table,
            Gaussian + bilinear scorer).
        scorer: The fixed scorer.
        tau: Temperature.
        n: Anchors per repetition.
        m: Negatives per anchor.
        shared: One shared set of ``m`` negatives (SSCRL) or ``m`` per anchor (SCRL).
        repetitions: Independent repetitions (>= 2).
        generator: Random generator.

    Returns:
        An :class:`InnerOuterError`.

    Example:
        >>> from crl.theory.models import TabularModel
        >>> model = TabularModel([0.5, 0.5], [[0.8, 0.2], [0.3, 0.7]])
        >>> err = inner_outer_error(model, model.optimal_table(1.0), 1.0, n=200, m=8,
        ...                         shared=False, repetitions=5,
        ...                         generator=torch.Generator().manual_seed(0))
        >>> err.inner_mean > 0  # Jensen: the log of a sample mean is biased low
        True
    """
    where = "inner_outer_error"
    check_positive(where, "tau", tau, allow_tensor=False)
    check_int_range(where, "n", n, 1, None)
    check_int_range(where, "m", m, 1, None)
    check_int_range(where, "repetitions", repetitions, 2, None)
    fn = as_scorer(model, scorer)
    population = model.risk(scorer, tau)
    inner, outer, emp = [], [], []
    for _ in range(repetitions):
        x, y = model.sample(n, generator)
        negatives = model.sample_negatives(x, m, generator, shared=shared)
        pos = fn(x, y).to(torch.float64)
        neg = score_negatives(fn, x, negatives, shared=shared).to(torch.float64)
        l_hat = float(anchor_empirical_risk(pos, neg, tau).mean())
        l_n = float(model.anchor_risk(scorer, x, y, tau).mean())
        inner.append(l_n - l_hat)
        outer.append(population - l_n)
        emp.append(l_hat)
    inner_a, outer_a, emp_a = np.array(inner), np.array(outer), np.array(emp)
    mean_emp = float(emp_a.mean())
    return InnerOuterError(
        n=n, m=m, shared=shared, repetitions=repetitions, population_risk=population,
        mean_empirical_risk=mean_emp,
        inner_mean=float(inner_a.mean()),
        inner_stderr=float(inner_a.std(ddof=1) / math.sqrt(repetitions)),
        inner_rms=float(np.sqrt(np.mean(inner_a**2))),
        outer_mean=float(outer_a.mean()), outer_rms=float(np.sqrt(np.mean(outer_a**2))),
        expected_gap=population - mean_emp,
        expected_gap_stderr=float(emp_a.std(ddof=1) / math.sqrt(repetitions)),
        fluctuation_rms=float(np.sqrt(np.mean((emp_a - mean_emp) ** 2))),
    )


@dataclass(frozen=True)
class RateFit:
    """``error ~ C m^-exponent`` fitted by least squares on ``log error`` against ``log m``.

    Attributes:
        exponent: The decay exponent (minus the log-log slope).
        low: Lower end of its confidence interval (Student t on the slope).
        high: Upper end.
        constant: ``C``.
        confidence: The interval's level.
    """

    exponent: float
    low: float
    high: float
    constant: float
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return asdict(self)


def fit_rate(m_values: Sequence[float], errors: Sequence[float], *,
             confidence: float = 0.95) -> RateFit:
    """Fit ``error = C m^-exponent`` in log-log space, with a confidence interval.

    Args:
        m_values: At least 3 positive values of ``m`` (not all equal).
        errors: The positive errors at those ``m``.
        confidence: Level of the interval, in ``(0, 1)``.

    Example:
        >>> fit = fit_rate([1, 2, 4, 8], [1.0, 0.5, 0.25, 0.125])
        >>> round(fit.exponent, 6), round(fit.constant, 6)
        (1.0, 1.0)
    """
    where = "fit_rate"
    m = np.asarray(m_values, dtype=np.float64)
    e = np.asarray(errors, dtype=np.float64)
    if m.ndim != 1 or e.shape != m.shape or m.size < 3:
        raise CrlValueError(f"{where}: `m_values` and `errors` must be 1-D of the same length "
                            f">= 3; got {describe(m_values)} and {describe(errors)}")
    if np.any(~np.isfinite(m)) or np.any(m <= 0) or np.any(~np.isfinite(e)) or np.any(e <= 0):
        raise CrlValueError(f"{where}: `m_values` and `errors` must be finite and > 0; got "
                            f"{m.tolist()!r:.60} and {e.tolist()!r:.60}")
    if not 0.0 < confidence < 1.0:
        raise CrlValueError(f"{where}: `confidence` must be in (0, 1); got {confidence}")
    lm, le = np.log(m), np.log(e)
    if np.ptp(lm) == 0:
        raise CrlValueError(f"{where}: `m_values` must not all be equal; got {m.tolist()}")
    res = stats.linregress(lm, le)
    half = float(stats.t.ppf(0.5 + confidence / 2, m.size - 2)) * float(res.stderr)
    slope = float(res.slope)
    return RateFit(exponent=-slope, low=-slope - half, high=-slope + half,
                   constant=float(np.exp(res.intercept)), confidence=confidence)
