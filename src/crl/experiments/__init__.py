"""Studies as code: a grid of run configs plus an analysis, a resumable parallel runner, plots
and a self-contained HTML report.

Example (the smoke preset of the negatives study on synthetic data takes seconds)::

    from crl.experiments import get_study, run_study, build_report
    study = get_study("negatives", preset="smoke", data="synthetic")
    outcome = run_study(study, "runs", workers=2)
    analysis = build_report(study, outcome.study_dir)
"""

from crl.experiments.registry import get_study, study_names
from crl.experiments.report import build_report, reproduce_command
from crl.experiments.runner import StudyOutcome, run_study
from crl.experiments.study import Analysis, RunSpec, Study

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
