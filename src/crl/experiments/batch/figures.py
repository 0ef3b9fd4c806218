"""The figure of the batch report: the metric against B per seed with the fitted curve and B*,
and the cost per B (docs/batch.md, "The report")."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from crl.experiments import plots
from crl.experiments.metrics import MetricSpec
from crl.experiments.negatives.curves import CurveCell
from crl.experiments.study import Figure


def batch_figure(rows: list[dict[str, Any]], cell: CurveCell, batches: list[dict[str, Any]],
                 spec: MetricSpec, study_dir: Path) -> Figure:
    """Left: ``spec`` against B (each seed, the seed-adjusted means, the fitted curve up to the
    best, B* and its interval). Right: peak RSS growth and time per step against B."""
    sign = 1.0 if spec.higher_is_better else -1.0
    fig, (ax, cost) = plots.subplots(2)
    for color, seed in zip(plots.COLORS[2:] * 10, cell.seeds, strict=False):
        mine = sorted((int(r["batch_size"]), float(r[spec.name])) for r in rows
                      if int(r["seed"]) == seed and isinstance(r.get(spec.name), (int, float))
                      and math.isfinite(float(r[spec.name])))
        if mine:
            xs, ys = zip(*mine, strict=True)
            ax.plot(xs, ys, ".", color=color, alpha=0.6, label=f"seed {seed}")
    ax.plot(cell.ms, [sign * v for v in cell.means], "o", color=plots.COLORS[0],
            label="seed-adjusted mean")
    top = max((b for b, f in zip(cell.ms, cell.fitted, strict=True) if math.isfinite(f)),
              default=cell.ms[0])
    grid = np.geomspace(cell.ms[0], top, 100)
    ax.plot(grid, [sign * cell.curve.at(float(b)) for b in grid], "-", color=plots.COLORS[0],
            lw=1.2, label=f"{cell.method} fit (up to the best)")
    if cell.m_star is not None:
        ax.axvline(cell.m_star, color=plots.COLORS[1], lw=1.2, label="B*")
    low = cell.lower if cell.lower > 0 else cell.ms[0]
    high = cell.upper if math.isfinite(cell.upper) else cell.ms[-1]
    ax.axvspan(low, high, color=plots.COLORS[1], alpha=0.12, label="B* 95% interval")
    plots.style(ax, "batch size B (log; m = B - 1 in-batch negatives)", spec.name, base=2)
    bs = [b["batch_size"] for b in batches]
    cost.plot(bs, [b["peak_rss_growth_mib"] for b in batches], "o-", color=plots.COLORS[0],
              label="peak RSS growth (MiB)")
    cost.set_yscale("log")
    twin = cost.twinx()
    twin.plot(bs, [b["step_s"] for b in batches], "s--", color=plots.COLORS[1],
              label="time per step (s)")
    twin.set_yscale("log")
    twin.set_ylabel("seconds per step")
    plots.style(cost, "batch size B (log)", "MiB above the loop's start", base=2)
    twin.legend(fontsize=8, loc="lower right")
    return plots.finish(fig, study_dir, "batch_curve.png",
                        f"{spec.name} against the batch size at a fixed sample budget, with the "
                        "fitted curve, B* and its interval; the memory and time each B cost.")
