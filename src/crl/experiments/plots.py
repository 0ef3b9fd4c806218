"""Figures of the study reports (matplotlib with the Agg backend: no display needed)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes

from crl.experiments.study import Figure

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


def save(fig: Any, path: Path) -> None:
    """Save ``fig`` as a PNG (dpi 120, written atomically: a kill never leaves half an image)
    and close it."""
    import io

    from crl.rundir import atomic_write

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=120, format="png")
    plt.close(fig)
    atomic_write(path, lambda f: f.write(buffer.getbuffer()))


def subplots(ncols: int, *, width: float = 5.2, height: float = 4.0) -> tuple[Any, list[Axes]]:
    """A figure with ``ncols`` axes side by side."""
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def mean_and_sd(rows: Iterable[dict[str, Any]], x_key: str, y_key: str
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Group ``rows`` by ``x_key``: sorted x, mean y, standard deviation of y, counts."""
    groups: dict[float, list[float]] = defaultdict(list)
    for row in rows:
        x, y = row.get(x_key), row.get(y_key)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and np.isfinite(y):
            groups[float(x)].append(float(y))
    xs = np.array(sorted(groups))
    means = np.array([np.mean(groups[x]) for x in xs])
    sds = np.array([np.std(groups[x], ddof=1) if len(groups[x]) > 1 else 0.0 for x in xs])
    counts = np.array([len(groups[x]) for x in xs])
    return xs, means, sds, counts


def errorbar_series(ax: Axes, rows: list[dict[str, Any]], x_key: str, y_key: str, *,
                    label: str, color: str, x_scale: float = 1.0,
                    curve: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
    """Plot the mean of ``y_key`` against ``x_key`` with seed error bars, and a fitted curve."""
    xs, means, sds, _ = mean_and_sd(rows, x_key, y_key)
    if xs.size == 0:
        return
    ax.errorbar(xs * x_scale, means, yerr=sds, fmt="o", color=color, capsize=3, ms=4,
                label=label)
    if curve is not None:
        grid = np.geomspace(xs.min(), xs.max(), 100)
        ax.plot(grid * x_scale, curve(grid), "-", color=color, alpha=0.7, lw=1.2)


def style(ax: Axes, xlabel: str, ylabel: str, *, xscale: str = "log", legend_size: int = 8,
          **scale: Any) -> None:
    """Label the axes, set the x scale, draw a light grid and the legend."""
    ax.set_xscale(xscale, **scale)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)


def finish(fig: Any, study_dir: Path, name: str, caption: str) -> Figure:
    """Save ``fig`` as ``plots/<name>`` of the study and return it as a report figure."""
    path = Path("plots") / name
    save(fig, study_dir / path)
    return Figure(str(path), caption)
