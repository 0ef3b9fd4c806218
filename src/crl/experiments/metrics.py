"""The metrics a study can summarise, each with its declared direction and range.

Whether higher is better is declared here, once per metric, as torchmetrics declares
``higher_is_better`` on each metric class; nothing is guessed from a metric's name. A study that
is asked for a metric this table does not know says so and lists the ones it knows.

Example:
    >>> spec = metric_spec("recall@1")
    >>> spec.higher_is_better, spec.bounds, spec.points(0.026)
    (True, (0.0, 1.0), 2.6)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crl.errors import CrlValueError


@dataclass(frozen=True)
class MetricSpec:
    """One summary metric.

    Attributes:
        name: Its column in ``results.csv`` (``recall@1`` is derived: the mean of both
            directions' recall@1).
        higher_is_better: True for scores (recall, accuracy, AUC), False for losses and ranks.
        bounds: The values the metric can take (``-inf``/``inf`` when open); a fitted
            asymptote outside them is impossible.
        description: What it measures, in words for a report.
        fraction: True when the metric is a fraction in [0, 1], so that differences read as
            points (1 point = 0.01), the unit the paper reports in.
    """

    name: str
    higher_is_better: bool
    bounds: tuple[float, float]
    description: str
    fraction: bool = False

    def points(self, difference: float) -> float:
        """A difference of the metric in points (x 100 for fractions, unchanged otherwise)."""
        return round(100.0 * difference, 10) if self.fraction else difference

    @property
    def unit(self) -> str:
        """``points`` for fractions, else ``units of <name>``."""
        return "points" if self.fraction else f"units of {self.name}"

    def error_bounds(self) -> tuple[float, float]:
        """The range of the fitted error (``1 - metric`` for scores, the metric itself else)."""
        low, high = self.bounds
        return (1.0 - high, 1.0 - low) if self.higher_is_better else (low, high)


def _table() -> dict[str, MetricSpec]:
    unit = (0.0, 1.0)
    specs = [
        MetricSpec("recall@1", True, unit, "recall@1, the mean of both retrieval directions",
                   fraction=True),
        MetricSpec("probe/knn_acc", True, unit, "kNN accuracy on the frozen representation",
                   fraction=True),
        MetricSpec("probe/linear_acc", True, unit, "linear-probe accuracy", fraction=True),
        MetricSpec("risk/contrastive", False, (-math.inf, math.inf),
                   "held-out contrastive risk"),
        MetricSpec("train/loss", False, (-math.inf, math.inf), "final training loss"),
    ]
    for way in ("x2y", "y2x"):
        for k in (1, 5, 10):
            specs.append(MetricSpec(f"retrieval/{way}_recall@{k}", True, unit,
                                    f"{way} recall@{k}", fraction=True))
        specs.append(MetricSpec(f"retrieval/{way}_auc", True, unit, f"{way} retrieval AUC",
                                fraction=True))
        for kind in ("mean", "median"):
            specs.append(MetricSpec(f"retrieval/{way}_{kind}_rank", False, (1.0, math.inf),
                                    f"{way} {kind} rank of the positive"))
    for name in IR_NAMES:  # crl.eval.ir's metrics, under their keys and their short names
        for k in (1, 5, 10, 100):
            # ``recall@k`` alone stays the paired retrieval recall (both directions' mean)
            for key in (f"ir/{name}@{k}",) + (() if name == "recall" else (f"{name}@{k}",)):
                specs.append(MetricSpec(key, True, unit, f"{IR_NAMES[name]}@{k} (eval.ir)",
                                        fraction=True))
    return {s.name: s for s in specs}


#: The IR metrics (:mod:`crl.eval.ir`) and their names in words.
IR_NAMES = {"ndcg": "nDCG", "mrr": "MRR", "map": "MAP", "recall": "recall",
            "precision": "precision"}


METRICS: dict[str, MetricSpec] = _table()


def metric_spec(name: str) -> MetricSpec:
    """The declared :class:`MetricSpec` of ``name``.

    Raises:
        CrlValueError: for a metric the table does not declare (the message lists them).
    """
    spec = METRICS.get(name)
    if spec is None:
        raise CrlValueError(f"study: metric {name!r} has no declared direction; choose one of "
                            + ", ".join(sorted(METRICS)))
    return spec


#: The two directions whose mean is the derived ``recall@1``.
RECALL_AT_1 = ("retrieval/x2y_recall@1", "retrieval/y2x_recall@1")


def ir_key(name: str) -> str | None:
    """The run metric an IR study metric is read from (``ndcg@10`` -> ``ir/ndcg@10``), None
    for any other metric; a study with one turns ``eval.ir`` on.

    Example:
        >>> ir_key("ndcg@10"), ir_key("ir/map@100"), ir_key("recall@1")
        ('ir/ndcg@10', 'ir/map@100', None)
    """
    short = name.removeprefix("ir/")
    if short.split("@")[0] not in IR_NAMES or name not in METRICS or name.startswith("recall"):
        return None
    return f"ir/{short}"


def metric_keys(name: str) -> tuple[str, ...]:
    """The keys of a run's flat metrics that metric ``name`` is read from (``recall@1``: both
    directions).

    Example:
        >>> metric_keys("recall@1"), metric_keys("probe/knn_acc")
        (('retrieval/x2y_recall@1', 'retrieval/y2x_recall@1'), ('probe/knn_acc',))
    """
    return RECALL_AT_1 if name == "recall@1" else (ir_key(name) or name,)


def with_study_metric(row: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A copy of results ``row`` holding study metric ``name`` under its own name when it is
    derived (``recall@1``) or a short IR name (``ndcg@10``: ``ir/ndcg@10``); NaN when the row
    lacks what it is read from. Other metrics are already columns: the copy is unchanged.

    Example:
        >>> with_study_metric({"retrieval/x2y_recall@1": 0.5,
        ...                    "retrieval/y2x_recall@1": 0.7}, "recall@1")["recall@1"]
        0.6
    """
    out = dict(row)
    if name == "recall@1" or ir_key(name):
        value = metric_value(row, name)
        out[name] = float("nan") if value is None else value
    return out


def metric_value(row: Mapping[str, Any], name: str) -> float | None:
    """The value of metric ``name`` in a run's flat metrics ``row`` (a summary or a results
    row), None when the row lacks it; ``recall@1`` is derived, the mean of the directions'
    ``retrieval/x2y_recall@1`` and ``retrieval/y2x_recall@1`` the row has.

    Example:
        >>> metric_value({"retrieval/x2y_recall@1": 0.5, "retrieval/y2x_recall@1": 0.25},
        ...              "recall@1")
        0.375
    """
    if name == "recall@1":
        values = [row.get(key) for key in RECALL_AT_1]
        nums = [float(v) for v in values if isinstance(v, (int, float))]
        return sum(nums) / len(nums) if nums else None
    value = row.get(ir_key(name) or name)
    return float(value) if isinstance(value, (int, float)) else None
