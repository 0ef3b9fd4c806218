"""``crl study batch``: how large an in-batch batch for this config? (docs/batch.md)

For several batch sizes B and paired seeds, the user's config (or the study's pycode
bag-of-tokens model with the CLIP loss) trains with its in-batch loss for the same number of
training pairs at every B (steps = budget / B), with gradient caching for every B above the
micro-batch (``train.micro_batch_size``). Every run is evaluated on the same held-out test pairs
and measures what its training loop cost here (peak memory growth, time per step). The analysis
reads B*, the smallest B within the tolerance of the best, from the fitted curve over log B with
exact seed resampling and censoring (:mod:`.curve`), shows how B* moves with the tolerance, and
links it to the negatives study's m: a batch of B gives m = B - 1 shared in-batch negatives.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import field_validator

from crl.errors import CrlValueError
from crl.experiments.batch import grid as grids
from crl.experiments.batch.analysis import BatchFacts, build_analysis
from crl.experiments.batch.curve import REGIME, b_star
from crl.experiments.batch.setup import check_batches, setup_section
from crl.experiments.metrics import (
    METRICS,
    metric_keys,
    metric_spec,
    with_study_metric,
)
from crl.experiments.negatives.refine import plan_refinement
from crl.experiments.negatives.tolerance import Tolerance, tolerance_option
from crl.experiments.study import Analysis, RunSpec, Study, StudyOptions
from crl.rundir import read_json, write_json

DATA_FILE = "data.json"
REFINEMENT_FILE = "refinement.json"
#: Refinement stages at most (each plans from the runs of all earlier ones).
MAX_STAGES = 2


class BatchOptions(StudyOptions):
    """The options of ``crl study batch`` (their meaning: :class:`BatchStudy`), checked before
    any run trains; ``study.json`` records them."""

    config: str | None = None
    metric: str = "recall@1"
    tolerance: float | str = 0.01
    batches: list[int] | None = None
    seeds: list[int] | None = None
    budget: int | None = None
    micro_batch_size: int | None = None
    num_train: int | None = None
    device: str | None = None
    refine_runs: int | None = None

    @field_validator("batches", "seeds", mode="before")
    @classmethod
    def _as_list(cls, value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else value

    @field_validator("tolerance", mode="before")
    @classmethod
    def _tolerance(cls, value: Any) -> float | str:
        """:func:`~crl.experiments.negatives.tolerance.tolerance_option`."""
        return tolerance_option(value)

    @field_validator("metric")
    @classmethod
    def _declared(cls, value: str) -> str:
        if value not in METRICS:
            raise ValueError("has no declared direction; choose one of "
                             + ", ".join(sorted(METRICS)))
        return value


class BatchStudy(Study):
    """The batch-size study (see the module docstring).

    Options:
        config: A ``crl train`` YAML config (or preset name) with an in-batch loss
            (:data:`~.grid.IN_BATCH_LOSSES`); its data, model, loss and optimiser stay, the
            study sets B, the budget, the micro-batch and the seeds. Default: the pycode pairs
            with the negatives study's bag-of-tokens model and the CLIP loss.
        metric: The summary metric (default: mean recall@1 both ways).
        tolerance: How close to the best counts as saturated: points of the metric (0.01) or a
            percentage of the best (``"2%"``).
        batches, seeds, budget: Override the preset's grid (budget: training pairs per run).
        micro_batch_size: Gradient caching for every B above it (default: the config's own,
            else the preset's 256).
        num_train: Training pairs used (default: the preset's; with ``config``, the config's).
        device: ``cpu`` or ``cuda`` for every run.
        refine_runs: Run budget of the refinement stage (default per preset; 0: off).
    """

    name = "batch"
    description = "How large an in-batch batch for this config? B* with its interval and cost."

    Options = BatchOptions
    settings: BatchOptions

    def __init__(self, preset: str = "quick", **options: Any) -> None:
        super().__init__(preset, **options)
        o = self.settings
        self.base: dict[str, Any] | None = None
        grid = grids.GRIDS[preset]
        if o.config is not None:
            from crl.train import load_config

            try:
                self.base = load_config(o.config).model_dump(mode="json")
            except CrlValueError as exc:
                raise CrlValueError(f"study batch: `--config`: {exc}") from None
            grids.check_in_batch(self.base, f"`--config` {o.config}")
            own = self.base["train"].get("micro_batch_size")  # the user's own, else preset's
            grid = replace(grid, num_train=self.base["data"].get("num_train"),
                           micro_batch_size=own or grid.micro_batch_size)
        self.grid = grids.override_grid(grid, batches=o.batches, seeds=o.seeds, budget=o.budget,
                                        micro_batch_size=o.micro_batch_size,
                                        num_train=o.num_train, refine_runs=o.refine_runs)
        self.metric = o.metric
        self.spec = metric_spec(self.metric)
        if self.metric.startswith("probe/") and (self.base is None or
                                                 self.base["data"]["name"] == "pycode"):
            raise CrlValueError(f"study batch: metric {self.metric!r} needs labelled data; the "
                                "pycode pairs have no labels (use recall@1)")
        self.tolerance = Tolerance.parse(o.tolerance)
        self.device = o.device
        self.added: list[dict[str, Any]] = []

    # -- the grid -------------------------------------------------------------------------

    def runs(self) -> list[RunSpec]:
        from crl.train import validate_config

        specs = [self._spec(b, s) for b in self.grid.batches for s in self.grid.seeds]
        specs += [self._spec(int(a["batch_size"]), int(a["seed"]), stage=int(a["stage"]))
                  for a in self.added]
        checked: set[str] = set()
        for spec in specs:  # every config is checked here, once, before any worker starts
            if spec.run_id not in checked:
                validate_config(spec.config, origin=f"study batch run {spec.run_id}")
                checked.add(spec.run_id)
        return specs

    def _spec(self, batch: int, seed: int, stage: int | None = None) -> RunSpec:
        if self.base is None:
            config = grids.default_run_config(self.grid, batch=batch, seed=seed,
                                              device=self.device)
        else:
            config = grids.user_run_config(self.base, self.grid, batch=batch, seed=seed,
                                           device=self.device,
                                           probe=self.metric.startswith("probe/"))
        micro = self.grid.micro_batch(batch)
        tags: dict[str, Any] = {"batch_size": batch, "m": batch - 1, "regime": REGIME,
                                "seed": seed, "steps": self.grid.steps(batch),
                                "micro_batch_size": 0 if micro is None else micro}
        if stage is not None:
            tags["stage"] = stage
        return RunSpec(config, tags, label=f"b{batch}-s{seed}")

    def execute(self, spec: RunSpec, run_dir: Path, *, resume: bool) -> None:
        from crl.experiments.batch.cost import metered_fit
        from crl.train import validate_config

        config = validate_config(spec.config, origin=f"study batch run {spec.run_id}")
        train_dir = run_dir / "train"
        again = any((train_dir / f).exists() for f in ("checkpoint.pt", "metrics.jsonl"))
        result, cost = metered_fit(config, train_dir, resume=again)
        write_json(run_dir / "summary.json", {**result.summary, **cost})

    # -- state in the study directory -------------------------------------------------------

    def check(self, study_dir: Path) -> None:
        """Check the data once (it loads, every B fits in the training pairs used) and every
        run config, before any worker starts; record the data's sizes."""
        self.load_state(study_dir)
        facts = check_batches(self.runs()[0].config, self.grid, self.metric)
        study_dir.mkdir(parents=True, exist_ok=True)
        write_json(study_dir / DATA_FILE, facts)

    def load_state(self, study_dir: Path) -> None:
        """Read the runs the refinement added (``refinement.json``)."""
        path = study_dir / REFINEMENT_FILE
        self.added = list(read_json(path).get("added", [])) if path.exists() else []

    def _n(self, study_dir: Path) -> int:
        data = read_json(study_dir / DATA_FILE) if (study_dir / DATA_FILE).exists() else {}
        n = data.get("num_train") or self.grid.num_train
        return int(n) if n else max(self.grid.batches)

    def refine(self, rows: list[dict[str, Any]], study_dir: Path) -> int:
        """Plan the next refinement stage from ``rows``: new B where the B* interval is widest
        in log B, every seed; returns the number of new runs."""
        budget = self.grid.refine_runs - len(self.added)
        stage = 1 + max((int(a["stage"]) for a in self.added), default=0)
        if budget <= 0 or stage > MAX_STAGES:
            return 0
        n = self._n(study_dir)
        cell = b_star(self._with_metric(rows), self.metric, self.spec.higher_is_better,
                      self.tolerance, n)
        if cell is None:
            return 0
        known = {s.run_id for s in self.runs()}
        new = []
        for a in plan_refinement([cell], budget):
            if not 2 <= a.m <= n:
                continue
            spec = self._spec(a.m, a.seed, stage=stage)
            if spec.run_id not in known:
                known.add(spec.run_id)
                new.append({"stage": stage, "batch_size": a.m, "seed": a.seed,
                            "reason": a.reason.replace("log m", "log B").replace(
                                "m inside", "B inside")})
        if new:
            self.added += new
            write_json(study_dir / REFINEMENT_FILE, {"added": self.added})
        return len(new)

    # -- analysis -------------------------------------------------------------------------

    def result_keys(self) -> tuple[str, ...]:
        """The summary metric's keys (``recall@1``: both directions' recall@1)."""
        return metric_keys(self.metric)

    def _with_metric(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [with_study_metric(row, self.metric) for row in rows]

    def analyze(self, rows: list[dict[str, Any]], study_dir: Path) -> Analysis:
        rows = self._with_metric(rows)
        data = read_json(study_dir / DATA_FILE) if (study_dir / DATA_FILE).exists() else {}
        distinct = len({r["run_id"] for r in rows})
        facts = BatchFacts(setup_section(self, data, distinct), self.grid, self._n(study_dir),
                           self.spec, self.tolerance, self.added)
        return build_analysis(rows, study_dir, facts)


def run_batch_study(preset: str = "quick", *, out: str | Path = "runs",
                    workers: int | None = None, progress: bool = True,
                    executor: Any = None, force: bool = False, keep_weights: bool = False,
                    **options: Any) -> tuple[Any, Analysis]:
    """Run ``crl study batch`` from Python: the grid (resuming an interrupted study in
    ``out/batch``), the refinement, and the report (``report.html``, ``analysis.json``,
    ``results.csv``); options as :class:`BatchStudy`'s.

    Returns:
        ``(outcome, analysis)``: :class:`~crl.experiments.runner.StudyOutcome` and the
        :class:`~crl.experiments.study.Analysis` (its ``numbers`` are ``analysis.json``'s).

    Example:
        >>> outcome, analysis = run_batch_study("quick", out="runs")  # doctest: +SKIP
        >>> analysis.numbers["b_star"], analysis.numbers["interval"]  # doctest: +SKIP
    """
    from crl.experiments.api import run_and_report

    return run_and_report("batch", preset=preset, out=out, workers=workers, progress=progress,
                          executor=executor, force=force, keep_weights=keep_weights, **options)
