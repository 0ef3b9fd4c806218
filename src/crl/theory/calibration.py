"""The calibration check: excess risk against excess AUC (docs/theory.md §4).

The calibration inequality, with the constant as reconstructed through Pinsker's inequality:
``E* - E(s) <= sqrt( (2 / tau) (L(s) - L*) )``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from crl._validation import check_positive
from crl.errors import CrlTypeError, CrlValueError
from crl.theory.estimators import mc_auc, mc_risk
from crl.theory.models import ExactModel


@dataclass(frozen=True)
class CalibrationReport:
    """Excess risk, excess AUC and the calibration bound of one scorer.

    Attributes:
        risk: ``L(s)``.
        optimal_risk: ``L*``.
        excess_risk: ``L(s) - L*`` (>= 0 up to Monte Carlo error).
        auc: ``E(s)``.
        optimal_auc: ``E*``.
        excess_auc: ``E* - E(s)``.
        bound: ``sqrt(2 max(L - L*, 0) / tau)``.
        holds: ``excess_auc <= bound`` (with a 1e-12 slack for rounding).
        exact: True when ``L(s)`` and ``E(s)`` are exact, False when Monte Carlo estimates.
        risk_stderr: Standard error of ``risk`` (0 when exact).
        auc_stderr: Standard error of ``auc`` (0 when exact).
        tau: The temperature.
    """

    risk: float
    optimal_risk: float
    excess_risk: float
    auc: float
    optimal_auc: float
    excess_auc: float
    bound: float
    holds: bool
    exact: bool
    risk_stderr: float
    auc_stderr: float
    tau: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return asdict(self)


def calibration_bound(excess_risk: float, tau: float) -> float:
    """``sqrt(2 max(excess_risk, 0) / tau)``, the largest excess AUC the inequality allows.

    Example:
        >>> calibration_bound(0.5, 1.0)
        1.0
    """
    check_positive("calibration_bound", "tau", tau, allow_tensor=False)
    if not math.isfinite(excess_risk):
        raise CrlValueError(f"calibration_bound: `excess_risk` must be finite; got {excess_risk}")
    return math.sqrt(2.0 * max(excess_risk, 0.0) / tau)


def calibration_report(model: ExactModel, scorer: Any, tau: float, *, exact: bool | None = None,
                       num_anchors: int = 20_000, num_negatives: int = 1_000,
                       generator: torch.Generator | None = None) -> CalibrationReport:
    """Excess risk ``L - L*``, excess AUC ``E* - E`` and the bound ``sqrt(2 (L - L*) / tau)``.

    Args:
        model: A model with exact ``L*`` and ``E*``.
        scorer: A scorer the model can evaluate exactly (a score table for tabular models, a
            bilinear scorer for the Gaussian ones) or any callable (then Monte Carlo).
        tau: Temperature.
        exact: True: require exact ``L(s)``, ``E(s)``; False: always Monte Carlo; None (default):
            exact where the model supports the scorer, Monte Carlo otherwise.
        num_anchors: Monte Carlo anchors.
        num_negatives: Monte Carlo negatives per anchor (for the risk; 64 for the AUC).
        generator: Random generator for the Monte Carlo estimates.

    Returns:
        A :class:`CalibrationReport`.

    Example:
        >>> from crl.theory.models import TabularModel
        >>> model = TabularModel([1.0], [[0.7, 0.2, 0.1]], [1 / 3, 1 / 3, 1 / 3])
        >>> rep = calibration_report(model, [[0.0, 0.0, 0.0]], 1.0)
        >>> rep.holds, round(rep.excess_auc, 4)
        (True, 0.2)
    """
    check_positive("calibration_report", "tau", tau, allow_tensor=False)
    risk_se = auc_se = 0.0
    use_exact = exact is not False
    if use_exact:
        try:
            risk = model.risk(scorer, tau)
            auc = model.auc(scorer)
        except (CrlTypeError, CrlValueError):
            if exact:
                raise
            use_exact = False
    if not use_exact:
        r = mc_risk(model, scorer, tau, num_anchors=num_anchors, num_negatives=num_negatives,
                    generator=generator)
        e = mc_auc(model, scorer, num_anchors=num_anchors, generator=generator)
        risk, risk_se, auc, auc_se = r.value, r.stderr, e.value, e.stderr
    l_star, e_star = model.optimal_risk(tau), model.optimal_auc()
    excess_risk, excess_auc = risk - l_star, e_star - auc
    bound = calibration_bound(excess_risk, tau)
    return CalibrationReport(
        risk=risk, optimal_risk=l_star, excess_risk=excess_risk, auc=auc, optimal_auc=e_star,
        excess_auc=excess_auc, bound=bound, holds=excess_auc <= bound + 1e-12, exact=use_exact,
        risk_stderr=risk_se, auc_stderr=auc_se, tau=float(tau),
    )
