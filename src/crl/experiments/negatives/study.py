"""``crl study negatives``: how many negatives can this data use? (docs/negatives.md)

The paper's experiment at our scale (Li, Wei, Yang and Ying, 2026; see
:mod:`crl.experiments.negatives.paper`). For several numbers of anchors ``n`` (nested subsets of the
training split), numbers of negatives per anchor ``m = f * n``, both regimes (each anchor its own
negative set, or one set shared by all) and several seeds, a model is trained with the global
contrastive loss at a fixed batch size (so ``m`` does not depend on the batch) for a fixed budget
of processed samples. Every run is evaluated on the same held-out test pairs. The analysis
locates ``m*`` per (regime, n) paired by seed, with censoring, fits ``m*(n) = e^c n^alpha`` per
regime and recommends m for the user's n; a refinement stage adds runs where an interval is
wide. With ``config=`` the sweep runs the user's own ``crl train`` config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator

from crl.errors import CrlValueError
from crl.experiments.metrics import METRICS, ir_key, metric_keys, metric_spec, metric_value
from crl.experiments.negatives import grid as grids
from crl.experiments.negatives.analysis import StudyFacts, build_analysis
from crl.experiments.negatives.curves import curve_cells
from crl.experiments.negatives.refine import plan_refinement
from crl.experiments.negatives.setup import (
    DATA_FILE,
    baseline_label,
    check_data,
    setup_section,
)
from crl.experiments.negatives.stats import REGIMES
from crl.experiments.negatives.tolerance import Tolerance
from crl.experiments.study import Analysis, RunSpec, Study, StudyOptions
from crl.models.config import ModelKind
from crl.rundir import read_json, write_json

FRACTIONS_FULL = grids.FRACTIONS_FULL
#: The summary metric per data set when none is given: on digits the pairs are two augmented
#: views of one image and held-out instance recall@1 stays near chance (about 0.02 among 360
#: test images at the quick budget, unmoved by m), so the class-level kNN accuracy is used.
DEFAULT_METRICS = {"digits": "probe/knn_acc"}
REFINEMENT_FILE = "refinement.json"
#: Refinement stages at most (each plans from the runs of all earlier ones).
MAX_STAGES = 3


class NegativesOptions(StudyOptions):
    """The options of ``crl study negatives`` (their meaning: :class:`NegativesStudy`), typed
    and checked before any run trains; ``study.json`` records them."""

    data: str = "pycode"
    config: str | None = None
    model: ModelKind | None = None
    metric: str | None = None
    tolerance: float | str = 0.01
    temperature: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    ns: list[int] | None = None
    fractions: list[float] | None = None
    seeds: list[int] | None = None
    budget: int | None = None
    batch_size: int | None = None
    device: str | None = None
    target_n: int | None = None
    refine_runs: int | None = None

    @field_validator("ns", "fractions", "seeds", mode="before")
    @classmethod
    def _as_list(cls, value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else value

    @field_validator("tolerance", mode="before")
    @classmethod
    def _tolerance(cls, value: Any) -> float | str:
        """A number of points stays a float (as ``study.json`` records it); a percentage stays
        its text (``2%``)."""
        try:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise CrlValueError("not a number or a percentage")
            parsed = Tolerance.parse(value)
        except CrlValueError:
            raise ValueError("must be a number of points of the metric >= 0 (e.g. 0.01) or a "
                             "percentage of the best below 100% (e.g. 2%)") from None
        return str(value).strip() if parsed.relative else parsed.value

    @field_validator("metric")
    @classmethod
    def _declared(cls, value: str | None) -> str | None:
        if value is not None and value not in METRICS:
            raise ValueError("has no declared direction; choose one of "
                             + ", ".join(sorted(METRICS)))
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str | None) -> str | None:
        from crl.train.config import TrainOptions

        if value is not None:
            try:
                TrainOptions(device=value)  # the runs' own rule for a device
            except ValidationError:
                raise ValueError("must be cpu, cuda or cuda:N") from None
        return value

    def recorded(self) -> dict[str, Any]:
        """``data``, ``metric`` and ``tolerance`` always, the others when given."""
        return {k: v for k, v in self.model_dump().items()
                if k in ("data", "metric", "tolerance") or v is not None}


class NegativesStudy(Study):
    """The negatives-versus-anchors study (see the module docstring).

    Options:
        data: ``pycode`` (default), ``digits``, ``synthetic``, or a ``.npz``/``.jsonl`` file
            (the model then follows the data, as in ``crl train``).
        config: A ``crl train`` YAML config (or preset name) to sweep: its data, model, loss
            options and optimiser stay; the study sets n, m, the seeds, the budget and the batch
            and trains with GCL unless the config asks for another loss with a negative set.
        model: Model kind (default per data set).
        metric: The summary metric (default: mean recall@1 both ways; on ``digits``
            ``probe/knn_acc``); its direction is declared in :mod:`crl.experiments.metrics`.
        tolerance: ``delta`` of ``m*(n; delta)``: points of the metric (``0.01``) or a
            percentage of the best (``"2%"``), :class:`~.tolerance.Tolerance`.
        temperature: GCL's ``tau`` (default 0.05; with ``config``, the config's).
        ns, fractions, seeds, budget, batch_size: Override the preset's grid.
        device: ``cpu`` or ``cuda`` for every run.
        target_n: The n to recommend m for (default: the whole training split).
        refine_runs: Run budget of the refinement stage (default per preset; 0: off).
    """

    name = "negatives"
    description = "How many negatives per anchor can this data use? m*(n) with intervals."
    #: ``execute`` is ``fit`` of the spec's config: runs of one (n, seed) may train together
    #: (crl.experiments.executors.grouping).
    fit_runs = True

    Options = NegativesOptions
    settings: NegativesOptions

    def __init__(self, preset: str = "quick", **options: Any) -> None:
        super().__init__(preset, **options)  # every option checked (NegativesOptions)
        o = self.settings
        config, model, metric, target_n = o.config, o.model, o.metric, o.target_n
        self.base: dict[str, Any] | None = None
        if config is not None:
            if model is not None:
                raise CrlValueError("study negatives: give `--model` or `--config`, not both "
                                    "(the config names its model)")
            from crl.train import load_config

            try:
                self.base = load_config(config).model_dump(mode="json")
            except CrlValueError as exc:
                raise CrlValueError(f"study negatives: `--config`: {exc}") from None
            data_name = str(self.base["data"]["name"])
            self.kind = data_name if data_name in grids.DATA_NAMES else "files"
            self.data_section = self.base["data"]
        else:
            self.kind, self.data_section = grids.data_section(o.data)
        self.model_section = (self.base["model"] if self.base is not None
                              else grids.model_section(self.kind, model))
        data_name = self.kind if self.base is None else str(self.base["data"]["name"])
        self.metric = metric or DEFAULT_METRICS.get(data_name, "recall@1")
        self.spec = metric_spec(self.metric)
        if self.metric.startswith("probe/") and data_name == "pycode":
            raise CrlValueError(f"study negatives: metric {self.metric!r} needs labelled data; "
                                "the pycode pairs have no labels (use recall@1, or --data digits)")
        self.grid = grids.override_grid(grids.GRIDS[self.kind][preset], ns=o.ns,
                                        fractions=o.fractions, seeds=o.seeds, budget=o.budget,
                                        batch_size=o.batch_size, refine_runs=o.refine_runs)
        self.tolerance = Tolerance.parse(o.tolerance)
        self.temperature = o.temperature
        self.device = o.device
        if target_n is not None and target_n < 2:
            raise CrlValueError(f"study negatives: `--target-n` must be an integer >= 2; got "
                                f"{target_n!r}")
        self.target_n = target_n
        self.added: list[dict[str, Any]] = []

    # -- the grid -------------------------------------------------------------------------

    def runs(self) -> list[RunSpec]:
        from crl.train import validate_config

        grid = self.grid
        specs = []
        for n in grid.ns:
            for fraction in grid.fractions:
                m = max(1, round(fraction * n))
                for regime in REGIMES:
                    for seed in grid.seeds:
                        specs.append(self._spec(n, m, fraction, regime, seed))
        for a in self.added:
            specs.append(self._spec(a["n"], a["m"], a["m"] / a["n"], a["regime"], a["seed"],
                                    stage=a["stage"]))
        checked: set[str] = set()
        for spec in specs:  # every config is checked here, once, before any worker starts
            if spec.run_id not in checked:
                validate_config(spec.config, origin=f"study negatives run {spec.run_id}")
                checked.add(spec.run_id)
        return specs

    def _spec(self, n: int, m: int, fraction: float, regime: str, seed: int,
              stage: int | None = None) -> RunSpec:
        # With m >= n - 1 every other sample is a negative in both regimes: one run serves both
        # (the two specs share a config, hence a run id; only their tags differ).
        run_regime = "shared" if m >= n - 1 else regime
        probe = self.metric.startswith("probe/")
        if self.base is None:
            config = grids.default_run_config(
                self.data_section, self.model_section, self.grid, n=n, m=m, regime=run_regime,
                seed=seed, temperature=0.05 if self.temperature is None else self.temperature,
                probe=probe, device=self.device, risk=self.metric == "risk/contrastive")
        else:
            config = grids.user_run_config(self.base, self.grid, n=n, m=m, regime=run_regime,
                                           seed=seed, temperature=self.temperature,
                                           probe=probe, device=self.device)
        if ir_key(self.metric):  # the IR metrics are computed only when asked for
            config["eval"]["ir"] = True
        tags: dict[str, Any] = {"n": n, "m": m, "m_fraction": fraction, "regime": regime,
                                "seed": seed,
                                "negatives_per_step": self.grid.negatives_per_step(n, m)}
        if stage is not None:
            tags["stage"] = stage
        return RunSpec(config, tags, label=f"n{n}-m{m}-{run_regime[:3]}-s{seed}")

    def execute(self, spec: RunSpec, run_dir: Path, *, resume: bool) -> None:
        from crl.experiments.runs import fit_study_run
        from crl.train import validate_config

        fit_study_run(validate_config(spec.config, origin=f"study negatives run {spec.run_id}"),
                      run_dir, resume=resume)

    # -- state in the study directory -------------------------------------------------------

    def check(self, study_dir: Path) -> None:
        """Check the data once (it loads, the model takes it, every n fits in its training
        split) and every run config, before any worker starts; record the data's sizes."""
        self.load_state(study_dir)
        first = self.runs()[0]
        facts = check_data(first.config, self.grid.ns, self.metric)
        study_dir.mkdir(parents=True, exist_ok=True)
        write_json(study_dir / DATA_FILE, facts)

    def load_state(self, study_dir: Path) -> None:
        """Read the runs the refinement added (``refinement.json``)."""
        path = study_dir / REFINEMENT_FILE
        self.added = list(read_json(path).get("added", [])) if path.exists() else []

    def refine(self, rows: list[dict[str, Any]], study_dir: Path) -> int:
        """Plan the next refinement stage from ``rows``; returns the number of new runs."""
        used = len(self.added)
        budget = self.grid.refine_runs - used
        stage = 1 + max((int(a["stage"]) for a in self.added), default=0)
        if budget <= 0 or stage > MAX_STAGES:
            return 0
        cells = curve_cells(self._with_metric(rows), self.metric, self.spec.higher_is_better,
                            self.tolerance)
        known = {s.run_id for s in self.runs()}
        new = []
        for a in plan_refinement(cells, budget):
            spec = self._spec(a.n, a.m, a.m / a.n, a.regime, a.seed, stage=stage)
            if spec.run_id not in known:
                known.add(spec.run_id)
                new.append({"stage": stage, "regime": a.regime, "n": a.n, "m": a.m,
                            "seed": a.seed, "reason": a.reason})
        if new:
            self.added += new
            write_json(study_dir / REFINEMENT_FILE, {"added": self.added})
        return len(new)

    # -- analysis -------------------------------------------------------------------------

    def result_keys(self) -> tuple[str, ...]:
        """The summary metric's keys (``recall@1``: both directions' recall@1)."""
        return metric_keys(self.metric)

    def _with_metric(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for row in rows:
            row = dict(row)
            if self.metric == "recall@1" or ir_key(self.metric):  # derived, or a short name
                value = metric_value(row, self.metric)
                row[self.metric] = float("nan") if value is None else value
            if row.get("negatives_per_step") is None:  # results written before runs recorded k
                row["negatives_per_step"] = self.grid.negatives_per_step(int(row["n"]),
                                                                         float(row["m"]))
            out.append(row)
        return out

    def analyze(self, rows: list[dict[str, Any]], study_dir: Path) -> Analysis:
        rows = self._with_metric(rows)
        if not any(self.metric in r for r in rows):
            raise CrlValueError(f"study negatives: metric {self.metric!r} is not in the results; "
                                f"available: {sorted({k for r in rows for k in r})}")
        data = read_json(study_dir / DATA_FILE) if (study_dir / DATA_FILE).exists() else {}
        target = self.target_n or int(data.get("train_size") or max(self.grid.ns))
        distinct = len({r["run_id"] for r in rows})
        facts = StudyFacts(setup_section(self, data, distinct), self.grid, target,
                           test_size=data.get("test_size"), baseline=data.get("baseline"),
                           baseline_label=baseline_label(data),
                           added=self.added)
        return build_analysis(rows, study_dir, spec=self.spec, tolerance=self.tolerance,
                              preset=self.preset, facts=facts)
