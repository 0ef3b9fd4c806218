"""What a study is: a named grid of runs, each a small JSON-able config, plus an analysis.

A study never holds state of its own between runs: everything it needs to resume, tabulate or
redraw lives in the study directory, so a killed study re-run
continues where it stopped and ``crl report`` rebuilds the report from the files alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from crl._validation import describe
from crl.errors import CrlValueError
from crl.rundir import read_json
from crl.train.config import stable_hash

if TYPE_CHECKING:
    from crl.experiments.results import Unreadable

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
    """A section of a report: paragraphs (plain text), tables, figures and ``code``: blocks
    shown as they are (a config to paste), after the paragraphs."""

    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    code: list[str] = field(default_factory=list)


@dataclass
class Analysis:
    """What a study concludes: report sections and the key numbers (saved as analysis.json).

    Attributes:
        unreadable: The finished runs left out because their results cannot be read (set by
            :func:`crl.experiments.report.build_report`; listed in the report).
        closing: What ``crl study`` prints after the headline ("" for nothing): the answer in
            a form to paste.
    """

    headline: str
    sections: list[Section]
    numbers: dict[str, Any]
    unreadable: list[Unreadable] = field(default_factory=list)
    closing: str = ""


class StudyOptions(BaseModel):
    """The options of a study (``crl study NAME --OPTION``, the ``options`` of ``study.json``):
    typed, unknown ones refused. Each study declares its own subclass as :attr:`Study.Options`;
    this one has none."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def recorded(self) -> dict[str, Any]:
        """What ``study.json`` records (default: every option that is not None)."""
        return self.model_dump(exclude_none=True)


def flag_name(option: str) -> str:
    """An option as the ``crl study`` flag that sets it.

    Example:
        >>> flag_name("batch_size")
        '`--batch-size`'
    """
    return f"`--{option.replace('_', '-')}`"


def check_options(model: type[StudyOptions], options: Mapping[str, Any], *, where: str,
                  name: Callable[[str], str] = flag_name) -> StudyOptions:
    """``options`` validated by ``model``; every problem on one line, each naming its option.

    Args:
        model: The study's :attr:`Study.Options`.
        options: The options as given (flags, keyword arguments, or ``study.json``).
        where: What the message starts with (``study negatives``, or the file).
        name: How an option is named: as a flag (the default), or as a key of a file.

    Raises:
        CrlValueError: naming each bad option, what it must be and what it got; an unknown
            option with the valid ones.

    Example:
        >>> check_options(StudyOptions, {"tolerance": 1}, where="study x")
        Traceback (most recent call last):
        ...
        crl.errors.CrlValueError: study x: `--tolerance`: unknown option; valid options: (none)
    """
    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            option, *inner = err["loc"]
            key = name(str(option)) + "".join(f"[{i}]" for i in inner)
            if err["type"] == "extra_forbidden":
                valid = ", ".join(model.model_fields) or "(none)"
                problems.append(f"{key}: unknown option; valid options: {valid}")
            else:
                message = err["msg"].removeprefix("Value error, ")
                problems.append(f"{key}: {message[:1].lower()}{message[1:]}; got "
                                f"{describe(err.get('input'))}")
        raise CrlValueError(f"{where}: " + "; ".join(problems)) from None


class StudyFile(BaseModel):
    """``study.json``: the study's name, its preset and its options (:meth:`Study.describe`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    study: str
    preset: Preset
    options: dict[str, Any] = Field(default_factory=dict)


def read_study_file(path: Path) -> StudyFile:
    """Read and check ``study.json`` (its options are checked by the study's own
    :attr:`Study.Options`, see :func:`crl.experiments.api.load_study`).

    Raises:
        CrlValueError: one line naming the file and each bad key (an unknown key with the
            valid ones).
    """
    data = read_json(path)
    try:
        return StudyFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(top level)"
            if err["type"] == "extra_forbidden":
                problems.append(f"{key}: unknown key; valid keys: "
                                + ", ".join(StudyFile.model_fields))
            else:
                problems.append(f"{key}: {err['msg'][:1].lower()}{err['msg'][1:]}"
                                + ("" if err["type"] == "missing"
                                   else f"; got {describe(err.get('input'))}"))
        raise CrlValueError(f"{path}: " + "; ".join(problems)) from None


class Study(ABC):
    """A grid of runs and the analysis of their results.

    Subclasses are registered by name in :mod:`crl.experiments.registry` and must be
    reconstructible from ``(preset, options)`` alone: worker processes rebuild them.
    """

    #: The study's name (``crl study NAME``).
    name: str = ""
    #: One line on what the study measures.
    description: str = ""
    #: The study's options, typed (its flags of ``crl study NAME``; none by default).
    Options: ClassVar[type[StudyOptions]] = StudyOptions

    def __init__(self, preset: str = "quick", **options: Any) -> None:
        if preset not in PRESETS:
            raise CrlValueError(
                f"study {self.name}: unknown preset {preset!r}; valid presets are "
                + ", ".join(repr(p) for p in PRESETS)
            )
        self.preset = preset
        #: The options, checked (every one before any run trains).
        self.settings = check_options(self.Options, options, where=f"study {self.name}")
        self.options = self.settings.recorded()

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

    def result_keys(self) -> tuple[str, ...]:
        """The summary values :meth:`analyze` reads from every row; each must be a finite
        number, or the run is listed as unreadable and left out (default: none)."""
        return ()

    def title(self) -> str:
        """The report's title (default: ``crl study NAME (PRESET)``)."""
        return f"crl study {self.name} ({self.preset})"

    def describe(self) -> dict[str, Any]:
        """What ``study.json`` records: name, preset and options (:class:`StudyFile`)."""
        return {"study": self.name, "preset": self.preset, "options": dict(self.options)}
