"""Evaluation: retrieval metrics computed blockwise, embedding geometry, and probes.

Everything here is a function of embeddings (tensors) and labels; nothing trains an encoder.
"""

from crl.eval.geometry import alignment, uniformity
from crl.eval.probes import ProbeResult, accuracy_scores, knn_probe, linear_probe, zero_shot
from crl.eval.retrieval import DEFAULT_KS, retrieval_metrics, retrieval_ranks
from crl.eval.risk import heldout_contrastive_risk
from crl.eval.scores import auc_criterion, average_precision, mean_average_precision

__all__ = [
    "DEFAULT_KS",
    "ProbeResult",
    "accuracy_scores",
    "alignment",
    "auc_criterion",
    "average_precision",
    "heldout_contrastive_risk",
    "knn_probe",
    "linear_probe",
    "mean_average_precision",
    "retrieval_metrics",
    "retrieval_ranks",
    "uniformity",
    "zero_shot",
]
