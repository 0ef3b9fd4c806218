"""``crl study gcl``: small-batch GCL against mini-batch InfoNCE (docs/negatives.md).

The mini-batch InfoNCE gradient is biased (the batch mean sits inside the log), so what it
minimises moves with the batch size; the global contrastive loss keeps a running estimate ``u_i`` of
each anchor's inner mean over all its negatives, which removes the bias. Both train the same
linear encoder on the same synthetic pairs for the same number of epochs at batch sizes 16, 64 and
256; the reference is full-batch training (every other training pair a negative: the two losses
coincide there) run to convergence. The measure is the objective all of them target, the
full-data contrastive risk of the training pairs, and the same risk on held-out pairs: how close
does each get to the full-batch result?
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from crl.experiments import plots
from crl.experiments.study import Analysis, Figure, RunSpec, Section, Study, Table

BATCHES = {"smoke": (16, 0), "quick": (16, 64, 256, 0), "full": (16, 64, 256, 0)}  # 0 = full
SEEDS = {"smoke": (0,), "quick": (0, 1), "full": (0, 1, 2)}
EPOCHS = {"smoke": 2, "quick": 10, "full": 50}
FULL_BATCH_STEPS = {"smoke": 20, "quick": 300, "full": 3000}
NUM_TRAIN = {"smoke": 256, "quick": 2048, "full": 8192}
LOSSES = ("gcl", "info_nce")
TAU = 0.1
TRAIN_RISK = "train/full_contrastive_risk"
METRICS = (TRAIN_RISK, "risk/contrastive", "retrieval/x2y_recall@1")


class GclStudy(Study):
    """Batch-size bias of InfoNCE against GCL (module docstring)."""

    name = "gcl"
    description = "Small-batch GCL vs mini-batch InfoNCE at B in {16, 64, 256, full}."

    def runs(self) -> list[RunSpec]:
        n = NUM_TRAIN[self.preset]
        specs = []
        for batch in BATCHES[self.preset]:
            size = batch or n
            budget: dict[str, int] = ({"steps": FULL_BATCH_STEPS[self.preset]} if batch == 0
                                      else {"epochs": EPOCHS[self.preset]})
            for loss in LOSSES:
                for seed in SEEDS[self.preset]:
                    config = {
                        "data": {"name": "synthetic", "num_train": n, "seed": seed,
                                 "synthetic": {"model": "correlated_gaussian", "dim": 16,
                                               "rho": 0.6, "num_samples": n + 1024}},
                        "model": {"kind": "linear", "embed_dim": 16},
                        "loss": {"name": loss, "temperature": TAU, "symmetric": True,
                                 "gcl": {"gamma": 0.9}},
                        "optim": {"name": "adamw", "lr": 1e-2, "weight_decay": 0.0},
                        "train": {"seed": seed, "batch_size": size, "log_every": 50,
                                  **budget},
                        "eval": {"probe": False, "geometry": False},
                    }
                    tags = {"batch": "full" if batch == 0 else batch, "batch_size": size,
                            "loss": loss, "seed": seed}
                    specs.append(RunSpec(config, tags, label=f"{loss}-b{size}-s{seed}"))
        from crl.train import validate_config

        for spec in specs:  # checked once here, before any worker starts
            validate_config(spec.config, origin=f"study gcl run {spec.run_id}")
        return specs

    def execute(self, spec: RunSpec, run_dir: Path, *, resume: bool) -> None:
        from crl.eval.risk import heldout_contrastive_risk
        from crl.experiments.runs import fit_study_run, load_trained
        from crl.rundir import write_json
        from crl.train import validate_config
        from crl.train.evaluation import encode_split

        config = validate_config(spec.config, origin=f"study gcl run {spec.run_id}")
        train_dir = run_dir / "train"
        result = fit_study_run(config, train_dir, resume=(train_dir / "checkpoint.pt").exists())
        built = load_trained(train_dir, config)
        za, zb = encode_split(built.model, built.train_ds, batch_size=4096)
        risk = heldout_contrastive_risk(za, zb, temperature=TAU)
        write_json(run_dir / "summary.json", {**result.summary, TRAIN_RISK: risk})

    def analyze(self, rows: list[dict[str, Any]], study_dir: Path) -> Analysis:
        means: dict[tuple[str, str, int], float] = {}
        table = []
        sizes = sorted({int(r["batch_size"]) for r in rows})
        full = max(sizes)
        for size in sizes:
            for loss in LOSSES:
                sub = [r for r in rows if int(r["batch_size"]) == size and r["loss"] == loss]
                if not sub:
                    continue
                cells: list[Any] = ["full" if size == full else size, loss]
                for metric in METRICS:
                    value = float(np.mean([float(r[metric]) for r in sub]))
                    means[(metric, loss, size)] = value
                    cells.append(value)
                table.append(cells)
        reference = {m: float(np.mean([v for (mm, _, s), v in means.items()
                                       if mm == m and s == full])) for m in METRICS}
        gaps = []
        for size in sizes:
            if size == full:
                continue
            row: list[Any] = [size]
            for metric in (TRAIN_RISK, "risk/contrastive"):
                for loss in LOSSES:
                    found = means.get((metric, loss, size))
                    row.append(float("nan") if found is None else found - reference[metric])
            gaps.append(row)
        figure = _plot(rows, study_dir, full)
        smallest = min(sizes)
        g, i = (means.get((TRAIN_RISK, loss, smallest)) for loss in LOSSES)
        if g is not None and i is not None and len(sizes) > 1:
            ref = reference[TRAIN_RISK]
            closer = "GCL" if abs(g - ref) < abs(i - ref) else "mini-batch InfoNCE"
            headline = (f"At batch size {smallest}, GCL ends {g - ref:+.4f} from the full-batch "
                        f"training objective and mini-batch InfoNCE {i - ref:+.4f}: {closer} "
                        "gets closer to the full-batch result.")
        else:
            headline = "GCL study: not enough finished runs."
        sections = [
            Section("Set-up", [
                f"Synthetic correlated-Gaussian pairs (d = 16, rho = 0.6), n = {full} training "
                f"pairs, a linear dual encoder with normalised outputs, tau = {TAU}, AdamW. Batch "
                f"sizes {', '.join(str(s) for s in sizes if s != full)} train for "
                f"{EPOCHS[self.preset]} epochs; the reference trains on the whole training "
                f"split as one batch for {FULL_BATCH_STEPS[self.preset]} steps (converged). "
                f"'{TRAIN_RISK}' is the contrastive risk of the training pairs with every other "
                "training pair as a negative, the objective every run targets; 'risk/contrastive' "
                "is the same on held-out pairs.",
            ]),
            Section("Results", [], tables=[
                Table("Mean over seeds", ["batch", "loss", *METRICS], table),
                Table("Distance to the full-batch result (run minus reference)",
                      ["batch", "train risk: gcl", "train risk: info_nce",
                       "held-out risk: gcl", "held-out risk: info_nce"], gaps)],
                    figures=[figure]),
        ]
        return Analysis(headline, sections, {"means": {f"{m}|{l}|{s}": v for (m, l, s), v
                                                       in means.items()}})


def _plot(rows: list[dict[str, Any]], study_dir: Path, full: int) -> Figure:
    fig, axes = plots.subplots(len(METRICS))
    for ax, metric in zip(axes, METRICS, strict=True):
        for color, loss in zip(plots.COLORS, LOSSES, strict=False):
            sub = [r for r in rows if r["loss"] == loss]
            plots.errorbar_series(ax, sub, "batch_size", metric, label=loss, color=color)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"batch size (full = {full})")
        ax.set_ylabel(f"{metric} (held-out)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    path = Path("plots") / "gcl_vs_batch.png"
    plots.save(fig, study_dir / path)
    return Figure(str(path), "Held-out metrics against the batch size, GCL and InfoNCE.")
