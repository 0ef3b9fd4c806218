"""``crl study gcl``: small-batch GCL against mini-batch InfoNCE (THEORY.md section 3).

The mini-batch InfoNCE gradient is biased (the batch mean sits inside the log), so its minimiser
moves with the batch size; the global contrastive loss keeps a running estimate ``u_i`` of each
anchor's inner mean over all its negatives, which removes the bias. Both are trained on the same
data for the same number of epochs at batch sizes 16, 64, 256 and the whole training split
(``full``, where the two coincide up to GCL's moving average); the question is how close each gets
to the full-batch result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from crl.experiments import plots
from crl.experiments.study import Analysis, Figure, RunSpec, Section, Study, Table

BATCHES = {"smoke": (16, 0), "quick": (16, 64, 256, 0), "full": (16, 64, 256, 0)}  # 0 = full
SEEDS = {"smoke": (0,), "quick": (0, 1), "full": (0, 1, 2)}
EPOCHS = {"smoke": 2, "quick": 40, "full": 200}
NUM_TRAIN = {"smoke": 256, "quick": 2048, "full": 4096}
LOSSES = ("gcl", "info_nce")
METRICS = ("risk/contrastive", "retrieval/x2y_recall@1")


class GclStudy(Study):
    """Batch-size bias of InfoNCE against GCL (module docstring)."""

    name = "gcl"
    description = "Small-batch GCL vs mini-batch InfoNCE at B in {16, 64, 256, full}."

    def runs(self) -> list[RunSpec]:
        n = NUM_TRAIN[self.preset]
        specs = []
        for batch in BATCHES[self.preset]:
            size = batch or n
            for loss in LOSSES:
                for seed in SEEDS[self.preset]:
                    config = {
                        "data": {"name": "synthetic", "num_train": n, "seed": seed,
                                 "synthetic": {"model": "correlated_gaussian", "dim": 16,
                                               "rho": 0.6, "num_samples": n + 1024}},
                        "model": {"kind": "mlp", "embed_dim": 32, "hidden_dim": 128},
                        "loss": {"name": loss, "temperature": 0.1, "symmetric": True,
                                 "gcl": {"gamma": 0.9}},
                        "optim": {"name": "adamw", "lr": 2e-3, "weight_decay": 1e-4},
                        "train": {"seed": seed, "batch_size": size,
                                  "epochs": EPOCHS[self.preset], "log_every": 50},
                        "eval": {"probe": False, "geometry": False},
                    }
                    tags = {"batch": "full" if batch == 0 else batch, "batch_size": size,
                            "loss": loss, "seed": seed}
                    specs.append(RunSpec(config, tags, label=f"{loss}-b{size}-s{seed}"))
        return specs

    def execute(self, spec: RunSpec, run_dir: Path, *, resume: bool) -> None:
        from crl.train import fit, validate_config

        fit(validate_config(spec.config, origin=f"study gcl run {spec.run_id}"), run_dir,
            resume=resume, progress=False)

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
        reference = {m: np.mean([v for (mm, _, s), v in means.items() if mm == m and s == full])
                     for m in METRICS}
        gaps = []
        for size in sizes:
            if size == full:
                continue
            row: list[Any] = [size]
            for loss in LOSSES:
                found = means.get(("risk/contrastive", loss, size))
                row.append(float("nan") if found is None
                           else found - float(reference["risk/contrastive"]))
            gaps.append(row)
        figure = _plot(rows, study_dir, full)
        smallest = min(sizes)
        g, i = (means.get(("risk/contrastive", loss, smallest)) for loss in LOSSES)
        if g is not None and i is not None:
            ref = float(reference["risk/contrastive"])
            headline = (f"At batch size {smallest}, GCL ends {g - ref:+.3f} from the full-batch "
                        f"held-out contrastive risk and mini-batch InfoNCE {i - ref:+.3f}.")
        else:
            headline = "GCL study: not enough finished runs."
        sections = [
            Section("Set-up", [
                "Synthetic correlated-Gaussian pairs (d = 16, rho = 0.6), an MLP dual encoder, "
                "tau = 0.1, the same number of epochs for every batch size; held-out metrics "
                "on the same test pairs. 'full' is one batch of the whole training split.",
            ]),
            Section("Results", [], tables=[
                Table("Mean over seeds", ["batch", "loss", *METRICS], table),
                Table("Held-out contrastive risk minus the full-batch result",
                      ["batch", *LOSSES], gaps)], figures=[figure]),
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
