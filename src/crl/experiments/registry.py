"""Studies by name (``crl study NAME``)."""

from __future__ import annotations

from typing import Any

from crl._validation import check_choice
from crl.experiments.study import Study


def _studies() -> dict[str, type[Study]]:
    from crl.experiments.batch import BatchStudy
    from crl.experiments.negatives import NegativesStudy
    from crl.experiments.studies.calibration import CalibrationStudy
    from crl.experiments.studies.gcl import GclStudy
    from crl.experiments.studies.imbalance import ImbalanceStudy

    studies: list[type[Study]] = [NegativesStudy, CalibrationStudy, ImbalanceStudy, GclStudy,
                                  BatchStudy]
    return {s.name: s for s in studies}


def study_names() -> list[str]:
    """The names of the registered studies."""
    return list(_studies())


def study_class(name: str) -> type[Study]:
    """The registered study ``name`` (an error lists the registered ones)."""
    studies = _studies()
    check_choice("crl study", "study", name, studies)
    return studies[name]


def get_study(name: str, *, preset: str = "quick", **options: Any) -> Study:
    """Build the study ``name`` for ``preset`` with ``options``."""
    return study_class(name)(preset, **options)
