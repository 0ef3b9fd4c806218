"""What a study is: a named grid of runs, each a small JSON-able config, plus an analysis.

A study never holds state of its own between runs: everything it needs to resume, tabulate or
redraw lives in the study directory, so a killed study re-run
continues where it stopped and ``crl report`` rebuilds the report from the files alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from crl.errors import CrlValueError
from crl.train.config import stable_hash

Preset = Literal["smoke", "quick", "full"]
PRESETS: tuple[str, ...] = ("smoke", "quick", "full")


@dataclass(frozen=True)
class RunSpec:
    """One run of a study.

    Attributes:
        config: Everything the run depends on (JSON-able). Its hash is the run id, so a changed
            config is a new run and an unchanged one is never redone.
        tags: The columns this run contributes to ``results.csv`` (``n``, ``m``, ``regime``,
            ``seed``...).
        label: A short human-readable name, used in progress displays.
    """

    config: dict[str, Any]
    tags: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def run_id(self) -> str:
        """``<label>-<hash of config>`` (the label only when given)."""
        digest = stable_hash(self.config)
        return f"{self.label}-{digest}" if self.label else digest


@dataclass
class Figure:
    """A figure of a report: a PNG in ``plots/`` and its caption."""

    path: str
    caption: str


@dataclass
class Table:
    """A table of a report."""

    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class Section:
    """A section of a report: paragraphs (plain text), tables and figures."""

    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


@dataclass
class Analysis:
    """What a study concludes: report sections and the key numbers (saved as analysis.json)."""

    headline: str
    sections: list[Section]
    numbers: dict[str, Any]


class Study(ABC):
    """A grid of runs and the analysis of their results.

    Subclasses are registered by name in :mod:`crl.experiments.registry` and must be
    reconstructible from ``(preset, options)`` alone: worker processes rebuild them.
    """

    #: The study's name (``crl study NAME``).
    name: str = ""
    #: One line on what the study measures.
    description: str = ""

    def __init__(self, preset: str = "quick", **options: Any) -> None:
        if preset not in PRESETS:
            raise CrlValueError(
                f"study {self.name}: unknown preset {preset!r}; valid presets are "
                + ", ".join(repr(p) for p in PRESETS)
            )
        self.preset = preset
        self.options = options

    @abstractmethod
    def runs(self) -> list[RunSpec]:
        """The grid of runs."""

    @abstractmethod
    def execute(self, spec: RunSpec, run_dir: Path, *, resume: bool) -> None:
        """Run one grid point into ``run_dir``; must end by writing ``summary.json`` atomically.

        ``resume`` is True when ``run_dir`` holds a checkpoint or metrics of an interrupted
        attempt.
        """

    @abstractmethod
    def analyze(self, rows: list[dict[str, Any]], study_dir: Path) -> Analysis:
        """Turn the rows of ``results.csv`` into report sections (figures go to ``plots/``)."""

    def check(self, study_dir: Path) -> None:
        """Check the data and every run config once, before any worker starts (default: build
        the grid, which validates what the study's ``runs`` validates)."""
        self.runs()

    def load_state(self, study_dir: Path) -> None:
        """Read what earlier stages recorded in ``study_dir`` (default: nothing)."""
        return None

    def refine(self, rows: list[dict[str, Any]], study_dir: Path) -> int:
        """Add runs planned from the finished ``rows`` (a second stage); returns how many were
        added (default: none)."""
        return 0

    def describe(self) -> dict[str, Any]:
        """What ``study.json`` records: name, preset and options."""
        return {"study": self.name, "preset": self.preset, "options": dict(self.options)}
