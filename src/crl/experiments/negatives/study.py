"""``crl study negatives``: how many negatives can this data use? (docs/negatives.md)

The paper's experiment at our scale (Li, Wei, Yang and Ying, 2026; see
:mod:`crl.experiments.negatives.paper`). For several numbers of anchors ``n`` (nested subsets of the
training split), numbers of negatives per anchor ``m = f * n``, both regimes (each anchor its own
negative set, or one set shared by all) and several seeds, a model is trained with the global
contrastive loss at a fixed batch size (so ``m`` does not depend on the batch) for a fixed budget
of processed samples. Every run is evaluated on the same held-out test pairs. The analysis
locates ``m*`` per (regime, n) paired by seed, with censoring, fits ``m*(n) = e^c n^alpha`` per
regime and recommends m for the user's n; a refinement stage adds runs where an interval is
wide; a control arm at one n trains the same m at a second batch size (does the curve follow m
or the negatives per step?, :mod:`.control`); a verify stage measures the recommendation at the
target n (:mod:`.verify`). With ``config=`` the sweep runs the user's own ``crl train`` config.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crl.errors import CrlValueError
from crl.experiments.metrics import ir_key, metric_keys, metric_spec, with_study_metric
from crl.experiments.negatives import grid as grids
from crl.experiments.negatives.memory import embedding_dim
from crl.experiments.negatives.options import (
    CONTROL_PRESETS,
    VERIFY_FILE,
    VERIFY_PRESETS,
    VERIFY_SEEDS,
    NegativesOptions,
)
from crl.experiments.negatives.setup import (
    DATA_FILE,
    baseline_label,
    check_data,
    check_ns,
    setup_section,
)
from crl.experiments.negatives.stats import REGIMES
from crl.experiments.negatives.tolerance import Tolerance
from crl.experiments.negatives.userdata import fit_span, user_training
from crl.experiments.study import Analysis, RunSpec, Study
from crl.rundir import read_json, write_json

if TYPE_CHECKING:
    from crl.experiments.negatives.verify import VerifyPlan, VerifyResult

# The analysis (curves, laws, the verify stage's planning: scipy) is imported where it is used,
# by the study's driver: a worker that unpickles the study to train its runs never loads it.

FRACTIONS_FULL = grids.FRACTIONS_FULL
#: The summary metric per data set when none is given: on digits the pairs are two augmented
#: views of one image and held-out instance recall@1 stays near chance (about 0.02 among 360
#: test images at the quick budget, unmoved by m), so the class-level kNN accuracy is used.
DEFAULT_METRICS = {"digits": "probe/knn_acc"}
REFINEMENT_FILE = "refinement.json"
#: Refinement stages at most (each plans from the runs of all earlier ones).
MAX_STAGES = 3


class NegativesStudy(Study):
    """The negatives-versus-anchors study (see the module docstring).

    Options:
        data: ``pycode`` (default), ``digits``, ``synthetic``, or a ``.npz``/``.jsonl`` file
            (the model then follows the data, as in ``crl train``).
        config: A ``crl train`` YAML config (or preset name) to sweep: its data, model, loss
            and its options, and optimiser stay; the study sets n, m, the seeds, the budget and
            the batch. A loss that takes no negative set is refused unless ``loss`` names one.
        loss: The loss to train (default: the config's, or GCL); it must take negative sets.
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
        target_epochs, target_samples: The training the user plans: every n trains this many
            epochs, or every run this many samples (``budget``; default: the preset's).
        verify: Run the verify stage at the target n (default: on in the full preset).
        verify_seeds: The seeds it trains (the grid's topped up; default
            :data:`~.verify.VERIFY_SEEDS`, at least 3).
        control, control_n: Run the control arm at a second batch size (default: on in the
            full preset), at ``control_n`` (one of the grid's n; default the largest).
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
            if o.data != NegativesOptions.model_fields["data"].default:
                raise CrlValueError(f"study negatives: give `--data` or `--config`, not both "
                                    f"(the config names its data: set data.files.path there); "
                                    f"got --data {o.data!r}")
            from crl.train import load_config

            try:
                self.base = load_config(config).model_dump(mode="json")
            except CrlValueError as exc:
                raise CrlValueError(f"study negatives: `--config`: {exc}") from None
            self.loss = grids.study_loss(str(self.base["loss"]["name"]), o.loss)
            data_name = str(self.base["data"]["name"])
            self.kind = data_name if data_name in grids.DATA_NAMES else "files"
            self.data_section = self.base["data"]
        else:
            self.loss = grids.study_loss("gcl", o.loss)
            self.kind, self.data_section = grids.data_section(o.data)
        self.model_section = (self.base["model"] if self.base is not None
                              else grids.model_section(self.kind, model))
        data_name = self.kind if self.base is None else str(self.base["data"]["name"])
        self.metric = metric or DEFAULT_METRICS.get(data_name, "recall@1")
        self.spec = metric_spec(self.metric)
        if self.metric.startswith("probe/") and data_name == "pycode":
            raise CrlValueError(f"study negatives: metric {self.metric!r} needs labelled data; "
                                "the pycode pairs have no labels (use recall@1, or --data digits)")
        if o.budget is not None and o.target_samples is not None \
                and o.budget != o.target_samples:
            raise CrlValueError(f"study negatives: `--budget` and `--target-samples` are one "
                                f"option; got {o.budget:,} and {o.target_samples:,}")
        budget = o.target_samples if o.target_samples is not None else o.budget
        chosen, self.grid_rule = grids.preset_grid(self.kind, preset,
                                                   self.model_section.get("kind"))
        self.grid = grids.override_grid(chosen, ns=o.ns,
                                        fractions=o.fractions, seeds=o.seeds, budget=budget,
                                        batch_size=o.batch_size, refine_runs=o.refine_runs,
                                        target_epochs=o.target_epochs)
        #: The preset's own grid for this data and model, and the grid before it is fitted to
        #: a file (:meth:`check`).
        self.chosen_grid = chosen
        self.preset_grid = self.grid
        self.verify = preset in VERIFY_PRESETS if o.verify is None else o.verify
        self.verify_seeds = VERIFY_SEEDS if o.verify_seeds is None else o.verify_seeds
        self.control = preset in CONTROL_PRESETS if o.control is None else o.control
        self._set_ns(self.grid.ns)
        self.tolerance = Tolerance.parse(o.tolerance)
        self.temperature = o.temperature
        self.device = o.device
        if target_n is not None and target_n < 2:
            raise CrlValueError(f"study negatives: `--target-n` must be an integer >= 2; got "
                                f"{target_n!r}")
        self.target_n = target_n
        self.added: list[dict[str, Any]] = []
        self.verify_plans: list[VerifyPlan] = []
        self.second_round_planned = False
        self.third_round_planned = False
        self.resolution_round_planned = False

    def _set_ns(self, ns: tuple[int, ...]) -> None:
        """The grid's n (the preset's, or fitted to a file) and the control arm's n."""
        self.grid = replace(self.grid, ns=ns)
        o = self.settings
        self.control_n = max(ns) if o.control_n is None else o.control_n
        if self.control and self.control_n not in ns:
            raise CrlValueError(f"study negatives: `--control-n` must be one of the swept n "
                                f"{list(ns)}; got {self.control_n}")

    def title(self) -> str:
        """``crl study negatives (quick)``; a custom grid or a span fitted to the file says so."""
        if grids.grid_changes(self.chosen_grid, self.preset_grid):
            return f"crl study negatives (custom grid, from the {self.preset} preset)"
        if self.grid.ns != self.preset_grid.ns:
            return f"crl study negatives ({self.preset}, n scaled to the file)"
        return super().title()

    @property
    def control_batch(self) -> int:
        """The control arm's batch size (:func:`~.control.control_batch`)."""
        from crl.experiments.negatives.control import control_batch

        return control_batch(self.grid.batch(self.control_n))

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
        if self.control:
            n = self.control_n
            for fraction in grid.fractions:
                for regime in REGIMES:
                    for seed in grid.seeds:
                        specs.append(self._spec(n, max(1, round(fraction * n)), fraction,
                                                regime, seed, arm="control",
                                                batch_size=self.control_batch))
        for plan in self.verify_plans:
            for m in plan.all_ms:
                for seed in plan.seeds:
                    specs.append(self._spec(plan.target_n, m, m / plan.target_n, plan.regime,
                                            seed, arm="verify"))
        checked: set[str] = set()
        for spec in specs:  # every config is checked here, once, before any worker starts
            if spec.run_id not in checked:
                validate_config(spec.config, origin=f"study negatives run {spec.run_id}")
                checked.add(spec.run_id)
        return specs

    def _spec(self, n: int, m: int, fraction: float, regime: str, seed: int,
              stage: int | None = None, arm: str | None = None,
              batch_size: int | None = None) -> RunSpec:
        # With m >= n - 1 every other sample is a negative in both regimes: one run serves both
        # (the two specs share a config, hence a run id; only their tags differ).
        run_regime = "shared" if m >= n - 1 else regime
        probe = self.metric.startswith("probe/")
        if self.base is None:
            config = grids.default_run_config(
                self.data_section, self.model_section, self.grid, n=n, m=m, regime=run_regime,
                seed=seed, temperature=0.05 if self.temperature is None else self.temperature,
                probe=probe, device=self.device, risk=self.metric == "risk/contrastive",
                batch_size=batch_size, loss=self.loss)
        else:
            config = grids.user_run_config(self.base, self.grid, n=n, m=m, regime=run_regime,
                                           seed=seed, temperature=self.temperature,
                                           probe=probe, device=self.device,
                                           batch_size=batch_size, loss=self.loss)
        if ir_key(self.metric):  # the IR metrics are computed only when asked for
            config["eval"]["ir"] = True
        tags: dict[str, Any] = {"n": n, "m": m, "m_fraction": fraction, "regime": regime,
                                "seed": seed, "negatives_per_step":
                                self.grid.negatives_per_step(n, m, batch_size)}
        if stage is not None:
            tags["stage"] = stage
        label = f"n{n}-m{m}-{run_regime[:3]}-s{seed}"
        if arm is not None:  # the grid's own runs keep the tags they always had
            tags.update(arm=arm, batch_size=self.grid.batch(n, batch_size))
            label += f"-b{self.grid.batch(n, batch_size)}" if arm == "control" else "-verify"
        return RunSpec(config, tags, label=label)

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
        facts = check_data(first.config, (), self.metric)
        fitted = None if self.kind != "files" or self.settings.ns is not None else \
            fit_span(self.preset_grid.ns, facts["train_size"])
        self._set_ns(self.preset_grid.ns if fitted is None else fitted)
        if fitted is not None:
            facts.update(fitted_ns=list(fitted), preset_ns=list(self.preset_grid.ns))
        check_ns(self.grid.ns, facts)
        facts.update(user_training(first.config, self.base, self.kind, facts["train_size"]))
        if self.verify and self.target_n is not None and self.target_n > facts["train_size"]:
            raise CrlValueError(f"study negatives: `--verify` trains at the target n, and "
                                f"`--target-n` {self.target_n:,} exceeds the "
                                f"{facts['train_size']:,} training pairs; give a smaller "
                                "--target-n or --no-verify")
        study_dir.mkdir(parents=True, exist_ok=True)
        write_json(study_dir / DATA_FILE, facts)

    def load_state(self, study_dir: Path) -> None:
        """Read the runs the refinement added (``refinement.json``) and the verify stage's plan
        (``verify.json``)."""
        path = study_dir / REFINEMENT_FILE
        self.added = list(read_json(path).get("added", [])) if path.exists() else []
        path = study_dir / VERIFY_FILE
        saved = read_json(path) if path.exists() else {}
        if saved.get("plans"):
            from crl.experiments.negatives.verify import VerifyPlan

            self.verify_plans = [VerifyPlan.from_dict(p) for p in saved["plans"]]
        else:
            self.verify_plans = []
        self.second_round_planned = bool(saved.get("second_round_planned", False))
        self.third_round_planned = bool(saved.get("third_round_planned", False))
        self.resolution_round_planned = bool(saved.get("resolution_round_planned", False))
        fitted = self._data(study_dir).get("fitted_ns")
        if fitted and self.settings.ns is None:  # the span fitted to the file by check()
            self._set_ns(tuple(int(n) for n in fitted))

    @staticmethod
    def _data(study_dir: Path) -> dict[str, Any]:
        return read_json(study_dir / DATA_FILE) if (study_dir / DATA_FILE).exists() else {}

    def _target(self, study_dir: Path) -> int:
        """``--target-n``, else the user's training pairs (:func:`~.userdata.user_training`;
        a study written before it recorded them: its training split)."""
        data = self._data(study_dir)
        return self.target_n or int(data.get("user_train_size") or data.get("train_size")
                                    or max(self.grid.ns))

    def refine(self, rows: list[dict[str, Any]], study_dir: Path) -> int:
        """Plan the next stage from ``rows``: a refinement stage while one adds runs, then the
        verify stage once, where it finds ``m_rec`` not within the tolerance its second round
        once, where the runs at the target n then only bound m* its third round once, and
        where the measured m around the reading there are more than
        :data:`~.curves.RESOLVED_STEP` apart its resolution round once; returns the number of
        new runs (0: no stage left)."""
        from crl.experiments.negatives.arms import arm

        rows = self._with_metric(rows)
        main = [r for r in rows if arm(r) == "main"]
        return (self._refine_stage(main, study_dir) or self._plan_verify(main, study_dir)
                or self._plan_second_round(rows, study_dir)
                or self._plan_third_round(rows, study_dir)
                or self._plan_resolution_round(rows, study_dir))

    def _plan_verify(self, main: list[dict[str, Any]], study_dir: Path) -> int:
        if not self.verify or self.verify_plans:
            return 0
        from crl.experiments.negatives.answer import answer
        from crl.experiments.negatives.verify import plan_verify

        target = self._target(study_dir)
        result = answer(main, self.metric, self.spec.higher_is_better, self.tolerance, target)
        largest = max(1, round(max(self.grid.fractions) * target))
        known = {s.run_id for s in self.runs()}
        self.verify_plans = plan_verify(result.recommendations, target, largest,
                                        self.grid.seeds, self.verify_seeds)
        self._write_verify(study_dir)
        return len({s.run_id for s in self.runs()} - known)

    def _plan_second_round(self, rows: list[dict[str, Any]], study_dir: Path) -> int:
        if not self.verify_plans or self.second_round_planned:
            return 0
        from crl.experiments.negatives.verify import plan_second_round

        added = self._plan_round(rows, study_dir, plan_second_round)
        self.second_round_planned = True
        self._write_verify(study_dir)
        return added

    def _plan_third_round(self, rows: list[dict[str, Any]], study_dir: Path) -> int:
        if not self.verify_plans or self.third_round_planned:
            return 0
        from crl.experiments.negatives.verify import plan_third_round

        added = self._plan_round(rows, study_dir, plan_third_round)
        self.third_round_planned = True
        self._write_verify(study_dir)
        return added

    def _plan_resolution_round(self, rows: list[dict[str, Any]], study_dir: Path) -> int:
        if not self.verify_plans or self.resolution_round_planned:
            return 0
        from crl.experiments.negatives.verify import plan_resolution_round

        added = self._plan_round(rows, study_dir, plan_resolution_round)
        self.resolution_round_planned = True
        self._write_verify(study_dir)
        return added

    def _plan_round(self, rows: list[dict[str, Any]], study_dir: Path,
                    planner: Callable[[VerifyResult], VerifyPlan]) -> int:
        """Replace each verify plan by ``planner`` of its result; the new runs' count."""
        from crl.experiments.negatives.arms import verify_results

        known = {s.run_id for s in self.runs()}
        results = {v.plan: v for v in verify_results(self, rows)}
        self.verify_plans = [planner(results[p]) if p in results else p
                             for p in self.verify_plans]
        return len({s.run_id for s in self.runs()} - known)

    def _write_verify(self, study_dir: Path) -> None:
        write_json(study_dir / VERIFY_FILE, {"plans": [p.to_dict() for p in self.verify_plans],
                                             "second_round_planned": self.second_round_planned,
                                             "third_round_planned": self.third_round_planned,
                                             "resolution_round_planned":
                                                 self.resolution_round_planned})

    def _refine_stage(self, rows: list[dict[str, Any]], study_dir: Path) -> int:
        from crl.experiments.negatives.curves import curve_cells
        from crl.experiments.negatives.refine import plan_refinement

        used = len(self.added)
        budget = self.grid.refine_runs - used
        stage = 1 + max((int(a["stage"]) for a in self.added), default=0)
        if budget <= 0 or stage > MAX_STAGES:
            return 0
        cells = curve_cells(rows, self.metric, self.spec.higher_is_better, self.tolerance)
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
            row = with_study_metric(row, self.metric)
            k = row.get("negatives_per_step")
            if k is None or (isinstance(k, float) and math.isnan(k)):  # written before runs
                row["negatives_per_step"] = self.grid.negatives_per_step(int(row["n"]),  # had k
                                                                         float(row["m"]))
            out.append(row)
        return out

    def analyze(self, rows: list[dict[str, Any]], study_dir: Path) -> Analysis:
        from crl.experiments.negatives.analysis import StudyFacts, build_analysis
        from crl.experiments.negatives.arms import (
            arm,
            control_note,
            control_results,
            target_rows,
            verify_note,
            verify_results,
        )

        rows = self._with_metric(rows)
        if not any(self.metric in r for r in rows):
            raise CrlValueError(f"study negatives: metric {self.metric!r} is not in the results; "
                                f"available: {sorted({k for r in rows for k in r})}")
        data = self._data(study_dir)
        distinct = len({r["run_id"] for r in rows})
        config = self.runs()[0].config
        kind = str(data.get("model_kind") or config["model"].get("kind"))
        verified = verify_results(self, rows)
        facts = StudyFacts(setup_section(self, data, distinct), self.grid,
                           self._target(study_dir), test_size=data.get("test_size"),
                           baseline=data.get("baseline"), baseline_label=baseline_label(data),
                           added=self.added, control=control_results(self, rows),
                           verify=verified, target_rows=target_rows(verified, rows),
                           verify_note=verify_note(self, study_dir),
                           control_note=control_note(self), run_config=config,
                           embed_dim=embedding_dim(config["model"], kind),
                           pretrained=data.get("pretrained"), grid_rule=self.grid_rule)
        analysis = build_analysis([r for r in rows if arm(r) == "main"], study_dir,
                                  spec=self.spec, tolerance=self.tolerance, preset=self.preset,
                                  facts=facts)
        # the preset's values a custom grid replaced, which the set-up's sentence quotes
        analysis.numbers["preset_values_replaced"] = {
            name: getattr(self.chosen_grid, name)
            for name in grids.grid_changes(self.chosen_grid, self.preset_grid)}
        return analysis
