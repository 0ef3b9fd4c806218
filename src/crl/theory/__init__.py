"""Theory you can check (docs/theory.md §1-§7).

Models with exact answers (:mod:`crl.theory.models`, :mod:`crl.theory.gaussian`), Monte Carlo
estimators with standard errors, the calibration check, inner and outer generalization error,
internal discrepancy, the InfoNCE mutual-information bound and the ``m*(n)`` fit
(:mod:`crl.theory.scaling`). See ``docs/theory.md`` for what each piece computes and which test
checks it.
"""

from crl.theory.calibration import CalibrationReport, calibration_bound, calibration_report
from crl.theory.discrepancy import DiscrepancyReport, collision_probability, internal_discrepancy
from crl.theory.estimators import (
    MonteCarloEstimate,
    anchor_empirical_risk,
    mc_auc,
    mc_risk,
    mi_lower_bound,
    score_negatives,
)
from crl.theory.gaussian import (
    BilinearScorer,
    CorrelatedGaussian,
    GaussianMeanShift,
    rotation_scorer,
)
from crl.theory.generalization import InnerOuterError, RateFit, fit_rate, inner_outer_error
from crl.theory.latent import LatentClassModel
from crl.theory.models import ExactModel, Scorer, TableScorer, TabularModel
from crl.theory.scaling import CriticalMResult, PowerLawFit, RegimeScaling, fit_critical_m

__all__ = [
    "BilinearScorer",
    "CalibrationReport",
    "CorrelatedGaussian",
    "CriticalMResult",
    "DiscrepancyReport",
    "ExactModel",
    "GaussianMeanShift",
    "InnerOuterError",
    "LatentClassModel",
    "MonteCarloEstimate",
    "PowerLawFit",
    "RateFit",
    "RegimeScaling",
    "Scorer",
    "TableScorer",
    "TabularModel",
    "anchor_empirical_risk",
    "calibration_bound",
    "calibration_report",
    "collision_probability",
    "fit_critical_m",
    "fit_rate",
    "inner_outer_error",
    "internal_discrepancy",
    "mc_auc",
    "mc_risk",
    "mi_lower_bound",
    "rotation_scorer",
    "score_negatives",
]
