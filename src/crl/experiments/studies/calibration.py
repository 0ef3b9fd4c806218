"""``crl study calibration``: excess AUC against excess risk along training (docs/theory.md §4).

On tabular models, where the population risk ``L`` and the AUC criterion ``E`` of any score table
are exact sums, a score table is trained by Adam on sampled anchors, positives and negatives with
each loss of crl (the contrastive risk = OCE with ``phi_tau``, the CVaR and softplus OCE risks,
and the four pairwise surrogates). Along each trajectory the exact excess risk ``L - L*`` and
excess AUC ``E* - E`` are recorded; every point must lie under the calibration bound
``E* - E <= sqrt(2 (L - L*) / tau)``. The exact minimisers of the pairwise surrogates (convex
programs on the population objective) show which surrogates are AUC-consistent: the hinge loss's
minimiser ties candidates that the optimal ranking separates, so it does not reach ``E*``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import linprog, minimize

from crl.experiments import plots
from crl.experiments.study import Analysis, Figure, RunSpec, Section, Study, Table
from crl.losses import oce_risk, pairwise_risk
from crl.rundir import read_json, write_json
from crl.theory.calibration import calibration_bound
from crl.theory.models import TabularModel

LOSSES = ("contrastive", "oce_cvar", "oce_softplus", "logistic", "exponential",
          "squared_hinge", "hinge")
PAIRWISE = ("logistic", "exponential", "squared_hinge", "hinge")
TAU = 0.5
# A model on which the pairwise hinge loss is not AUC-consistent (found by solving its exact
# minimiser on random 3-candidate models): the minimiser ties candidates 0 and 1.
HINGE_COUNTEREXAMPLE = {"p_x": [1.0], "p_pos": [[0.356, 0.241, 0.403]],
                        "p_neg": [[0.387, 0.392, 0.221]]}
TRAJECTORY_FILE = "trajectory.json"
STEPS = {"smoke": 60, "quick": 1500, "full": 20000}
SEEDS = {"smoke": (0,), "quick": (0, 1), "full": (0, 1, 2, 3, 4)}


def model_spec(name: str) -> dict[str, Any]:
    """The tabular model ``name`` (``random``: 5 anchors x 8 candidates, seeded Dirichlet
    laws; ``hinge_counterexample``) as plain lists."""
    if name == "hinge_counterexample":
        return HINGE_COUNTEREXAMPLE
    rng = np.random.default_rng(2024)
    p_x = rng.dirichlet(np.ones(5))
    p_pos = rng.dirichlet(np.full(8, 0.7), size=5)
    p_neg = rng.dirichlet(np.full(8, 3.0))
    return {"p_x": p_x.tolist(), "p_pos": p_pos.tolist(), "p_neg": [p_neg.tolist()] * 5}


def build_model(spec: dict[str, Any]) -> TabularModel:
    """A :class:`TabularModel` from :func:`model_spec`'s lists."""
    return TabularModel(spec["p_x"], spec["p_pos"], spec["p_neg"])


def sampled_loss(loss: str, delta: torch.Tensor) -> torch.Tensor:
    """The loss of ``delta (B, M) = s(x, y') - s(x, y)`` under crl's implementation."""
    if loss == "contrastive":
        return oce_risk(delta, phi="kl", temperature=TAU)
    if loss == "oce_cvar":
        return oce_risk(delta, phi="cvar", alpha=0.2)
    if loss == "oce_softplus":
        return oce_risk(delta, phi="softplus")
    return pairwise_risk(delta, loss=loss)  # type: ignore[arg-type]


def train_trajectory(model: TabularModel, loss: str, *, steps: int, seed: int,
                     batch: int = 64, negatives: int = 16, lr: float = 0.05
                     ) -> dict[str, list[float]]:
    """Adam on sampled batches; exact excess risk and excess AUC at log-spaced steps."""
    generator = torch.Generator().manual_seed(seed)
    table = torch.zeros(model.num_anchors, model.num_candidates, dtype=torch.float64,
                        requires_grad=True)
    optimizer = torch.optim.Adam([table], lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    l_star, e_star = model.optimal_risk(TAU), model.optimal_auc()
    marks = set(np.unique(np.geomspace(1, steps, 40).astype(int)).tolist()) | {0}
    out: dict[str, list[float]] = {"step": [], "excess_risk": [], "excess_auc": [],
                                   "bound": []}
    for step in range(steps + 1):
        if step in marks:
            current = table.detach().numpy()
            excess_risk = max(model.risk(current, TAU) - l_star, 0.0)
            out["step"].append(step)
            out["excess_risk"].append(excess_risk)
            out["excess_auc"].append(e_star - model.auc(current))
            out["bound"].append(calibration_bound(excess_risk, TAU))
        if step == steps:
            break
        x, y = model.sample(batch, generator)
        y_neg = model.sample_negatives(x, negatives, generator)  # (B, M)
        delta = table[x.unsqueeze(1), y_neg] - table[x, y].unsqueeze(1)  # (B, M)
        optimizer.zero_grad()
        objective = sampled_loss(loss, delta)
        objective.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        schedule.step()
    return out


def pairwise_minimiser(model: TabularModel, loss: str) -> np.ndarray:
    """The exact minimiser of the population pairwise risk (a linear program for the hinge,
    L-BFGS on the smooth convex objective otherwise), per anchor row."""
    rows = []
    for x in range(model.num_anchors):
        p_pos, p_neg = model.p_pos[x], model.p_neg_matrix[x]
        k = p_pos.shape[0]
        weights = np.outer(p_pos, p_neg)  # (Y, Y'): P(y) P(y')
        if loss == "hinge":
            # variables: s (k), slack xi (k*k); min sum w xi, xi >= 1 - (s_y - s_y'), xi >= 0
            cost = np.concatenate([np.zeros(k), weights.ravel()])
            a_ub = np.zeros((k * k, k + k * k))
            for y in range(k):
                for z in range(k):
                    r = y * k + z
                    a_ub[r, k + r] = -1.0
                    a_ub[r, y] -= 1.0
                    a_ub[r, z] += 1.0
            bounds = [(-20.0, 20.0)] * k + [(0.0, None)] * (k * k)
            res = linprog(cost, A_ub=a_ub, b_ub=-np.ones(k * k), bounds=bounds,
                          method="highs")
            rows.append(res.x[:k] - res.x[:k].mean())
        else:
            def objective(s: np.ndarray, w: np.ndarray = weights) -> float:
                t = s[:, None] - s[None, :]
                return float((w * _pairwise_np(t, loss)).sum())

            res = minimize(objective, np.zeros(k), method="L-BFGS-B")
            rows.append(res.x - res.x.mean())
    return np.stack(rows)


def _pairwise_np(t: np.ndarray, loss: str) -> np.ndarray:
    if loss == "logistic":
        return np.asarray(np.logaddexp(0.0, -t))
    if loss == "exponential":
        return np.asarray(np.exp(-t))
    if loss == "squared_hinge":
        return np.asarray(np.maximum(0.0, 1.0 - t) ** 2)
    return np.asarray(np.maximum(0.0, 1.0 - t))


class CalibrationStudy(Study):
    """Calibration of the contrastive losses against the AUC criterion (module docstring)."""

    name = "calibration"
    description = "Excess AUC against excess risk along training, with the calibration bound."

    def runs(self) -> list[RunSpec]:
        specs = []
        for model in ("random", "hinge_counterexample"):
            for loss in LOSSES:
                for seed in SEEDS[self.preset]:
                    config = {"model": model, "loss": loss, "seed": seed,
                              "steps": STEPS[self.preset], "tau": TAU}
                    specs.append(RunSpec(config, {"model": model, "loss": loss, "seed": seed},
                                         label=f"{model}-{loss}-s{seed}"))
        return specs

    def execute(self, spec: RunSpec, run_dir: Path, *, resume: bool) -> None:
        cfg = spec.config
        model = build_model(model_spec(cfg["model"]))
        trajectory = train_trajectory(model, cfg["loss"], steps=cfg["steps"], seed=cfg["seed"])
        holds = all(e <= b + 1e-12 for e, b in zip(trajectory["excess_auc"], trajectory["bound"],
                                                   strict=True))
        write_json(run_dir / TRAJECTORY_FILE, trajectory)
        write_json(run_dir / "summary.json", {
            "final/excess_risk": trajectory["excess_risk"][-1],
            "final/excess_auc": trajectory["excess_auc"][-1],
            "final/bound": trajectory["bound"][-1],
            "bound_holds": holds,
        })

    def analyze(self, rows: list[dict[str, Any]], study_dir: Path) -> Analysis:
        trajectories = [(r, read_json(study_dir / str(r["run_id"]) / TRAJECTORY_FILE))
                        for r in rows]
        violations = sum(1 for r in rows if str(r.get("bound_holds")) != "True")
        minimisers = _minimiser_check(study_dir)
        figure = _plot(trajectories, study_dir)
        table_rows = []
        for model in ("random", "hinge_counterexample"):
            for loss in LOSSES:
                sub = [r for r in rows if r["model"] == model and r["loss"] == loss]
                if sub:
                    table_rows.append([model, loss, float(np.mean([r["final/excess_risk"]
                                                                   for r in sub])),
                                       float(np.mean([r["final/excess_auc"] for r in sub])),
                                       len(sub)])
        exact_rows = [[m["model"], m["loss"], m["excess_auc"]] for m in minimisers]
        hinge = [m for m in minimisers if m["loss"] == "hinge"
                 and m["model"] == "hinge_counterexample"]
        consistent = [m for m in minimisers if m["loss"] != "hinge"]
        worst = max((m["excess_auc"] for m in consistent), default=float("nan"))
        headline = (
            f"The calibration bound E* - E <= sqrt(2 (L - L*) / tau) held at every recorded "
            f"point of {len(rows) - violations} of {len(rows)} trajectories. "
            f"The exact hinge minimiser misses E* by {hinge[0]['excess_auc']:.4f} on the "
            f"counterexample; the logistic, exponential and squared-hinge minimisers miss it "
            f"by at most {worst:.1e}." if hinge else "Calibration study.")
        sections = [
            Section("Trajectories under the bound", [
                f"Score tables trained with Adam on sampled batches (64 anchors, 16 negatives "
                f"each, tau = {TAU}) on two tabular models. Each point is one recorded step; the "
                "black curve is the calibration bound; a point above it would refute the "
                "inequality.",
            ], figures=[figure]),
            Section("Where training ends", [], tables=[Table(
                "Mean over seeds at the last step",
                ["model", "loss", "L - L*", "E* - E", "seeds"], table_rows)]),
            Section("Consistency of the pairwise surrogates (exact minimisers)", [
                "Minimising each pairwise surrogate exactly on the population objective: "
                "logistic, exponential and squared hinge order the candidates like the density "
                "ratio, so their excess AUC is 0; the hinge loss's minimiser ties candidates "
                "the optimal ranking separates, so its excess AUC stays positive.",
            ], tables=[Table("Excess AUC of the exact minimiser", ["model", "loss", "E* - E"],
                             exact_rows)]),
        ]
        numbers = {"bound_violations": violations, "runs": len(rows),
                   "exact_minimisers": minimisers}
        return Analysis(headline, sections, numbers)


def _minimiser_check(study_dir: Path) -> list[dict[str, Any]]:
    path = study_dir / "minimisers.json"
    if path.exists():
        cached: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["rows"]
        return cached
    out = []
    for name in ("random", "hinge_counterexample"):
        model = build_model(model_spec(name))
        e_star = model.optimal_auc()
        for loss in PAIRWISE:
            table = pairwise_minimiser(model, loss)
            out.append({"model": name, "loss": loss, "excess_auc": e_star - model.auc(table)})
    write_json(path, {"rows": out})
    return out


def _plot(trajectories: list[tuple[dict[str, Any], dict[str, Any]]],
          study_dir: Path) -> Figure:
    fig, axes = plots.subplots(2)
    for ax, model in zip(axes, ("random", "hinge_counterexample"), strict=True):
        top, bottom = 1e-9, 1.0
        for color, loss in zip(plots.COLORS, LOSSES, strict=False):
            first = True
            for row, traj in trajectories:
                if row["model"] != model or row["loss"] != loss:
                    continue
                risk = np.maximum(np.array(traj["excess_risk"]), 1e-8)
                auc = np.array(traj["excess_auc"])
                top = max(top, float(risk.max()))
                bottom = min(bottom, float(risk.min()))
                ax.plot(risk, auc, ".-", color=color, alpha=0.6, ms=3, lw=0.8,
                        label=loss if first else None)
                first = False
        grid = np.geomspace(min(bottom, top) / 3, max(top, 1e-6), 200)
        ax.plot(grid, [calibration_bound(float(g), TAU) for g in grid], "k-", lw=1.5,
                label="bound sqrt(2 (L - L*) / tau)")
        ax.set_xscale("log")
        ax.set_xlabel("excess contrastive risk L - L* (nats x tau)")
        ax.set_ylabel("excess AUC E* - E")
        ax.set_ylim(bottom=-0.01, top=min(0.6, max(0.05, math.sqrt(2 * top / TAU) * 1.1)))
        ax.set_title(f"{model} model")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    path = Path("plots") / "calibration.png"
    plots.save(fig, study_dir / path)
    return Figure(str(path), "Excess AUC against excess risk along training, per loss, with the "
                  "calibration bound.")
