"""Studies as code: a grid of run configs plus an analysis, a resumable parallel runner, plots
and a self-contained HTML report.

The framework lives at the top (study, runner, results, report, plots, metrics, runs, registry,
api); where the runs execute is :mod:`crl.experiments.executors`; the studies are
:mod:`crl.experiments.negatives` and :mod:`crl.experiments.studies`. The names below are
imported on first use, so that the CLI reads the executors' flags without loading the trainer.

Example (the smoke preset of the negatives study on synthetic data takes seconds)::

    from crl.experiments import get_study, run_study, build_report
    study = get_study("negatives", preset="smoke", data="synthetic")
    outcome = run_study(study, "runs", workers=2)
    analysis = build_report(study, outcome.study_dir)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crl.experiments.registry import get_study, study_names
    from crl.experiments.report import build_report, reproduce_command
    from crl.experiments.runner import StudyOutcome, run_study
    from crl.experiments.study import Analysis, RunSpec, Study

#: The module of each name of the package.
_HOMES = {
    "Analysis": "crl.experiments.study",
    "RunSpec": "crl.experiments.study",
    "Study": "crl.experiments.study",
    "StudyOutcome": "crl.experiments.runner",
    "build_report": "crl.experiments.report",
    "get_study": "crl.experiments.registry",
    "reproduce_command": "crl.experiments.report",
    "run_study": "crl.experiments.runner",
    "study_names": "crl.experiments.registry",
}

__all__ = [
    "Analysis",
    "RunSpec",
    "Study",
    "StudyOutcome",
    "build_report",
    "get_study",
    "reproduce_command",
    "run_study",
    "study_names",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'crl.experiments' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
