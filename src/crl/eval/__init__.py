"""Evaluation: retrieval metrics computed blockwise (paired, and with qrels: nDCG, MRR, MAP),
embedding geometry, and probes.

Everything here is a function of embeddings (tensors) and labels; nothing trains an encoder.
"""

from crl.eval.geometry import alignment, uniformity
from crl.eval.ir import IR_KS, Relevance, TopK, ir_metrics, ranking_metrics, top_k
from crl.eval.probes import ProbeResult, accuracy_scores, knn_probe, linear_probe, zero_shot
from crl.eval.retrieval import DEFAULT_KS, retrieval_metrics, retrieval_ranks
from crl.eval.risk import heldout_contrastive_risk
from crl.eval.scores import auc_criterion, average_precision, mean_average_precision

__all__ = [
    "DEFAULT_KS",
    "IR_KS",
    "ProbeResult",
    "Relevance",
    "TopK",
    "accuracy_scores",
    "alignment",
    "auc_criterion",
    "average_precision",
    "heldout_contrastive_risk",
    "ir_metrics",
    "knn_probe",
    "linear_probe",
    "mean_average_precision",
    "ranking_metrics",
    "retrieval_metrics",
    "retrieval_ranks",
    "top_k",
    "uniformity",
    "zero_shot",
]
