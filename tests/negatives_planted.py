"""Planted answers for the negatives statistics tests: tables with a known m*, result rows
from a known law m*(n) = e^c n^alpha, and cells built directly with a chosen m* and interval."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from crl.experiments.negatives.curvefit import Isotonic
from crl.experiments.negatives.curves import CurveCell


def saturating_gap(m_star: float, m_first: float, m_last: float, beta: float,
                   tolerance: float) -> float:
    """The gap ``A`` that puts m* (within ``tolerance`` of the curve at ``m_last``) at
    ``m_star`` on ``plateau - A (m / m_first)^-beta``."""
    return tolerance / ((m_star / m_first) ** -beta - (m_last / m_first) ** -beta)


def planted_table(ms: list[float], m_star: float, *, seeds: int, noise: float,
                  rng: np.random.Generator, beta: float = 1.0, tolerance: float = 0.01,
                  seed_spread: float = 0.05) -> np.ndarray:
    """``(seeds, M)`` scores on a saturating curve with m* at ``m_star``, plus a seed level
    (``seed_spread``) and independent noise (``noise``)."""
    grid = np.asarray(ms, dtype=np.float64)
    gap = saturating_gap(m_star, grid[0], grid[-1], beta, tolerance)
    curve = 0.5 - gap * (grid / grid[0]) ** -beta
    levels = rng.normal(0, seed_spread, size=(seeds, 1))
    return curve[None, :] + levels + rng.normal(0, noise, size=(seeds, len(ms)))


def law_rows(ns: list[int], alpha: float, c: float, *, seeds: int, noise: float,
             seed: int = 0, regime: str = "independent",
             fractions: tuple[float, ...] = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0),
             breaks: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """Result rows whose m*(n) follows ``e^c n^alpha`` (times ``breaks[n]`` where given)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in ns:
        ms = sorted({max(1, round(f * n)) for f in fractions})
        m_star = math.exp(c) * n ** alpha * (breaks or {}).get(n, 1.0)
        table = planted_table(ms, m_star, seeds=seeds, noise=noise, rng=rng)
        for s in range(seeds):
            for j, m in enumerate(ms):
                rows.append({"regime": regime, "n": n, "m": m, "seed": s,
                             "score": float(table[s, j])})
    return rows


def cell(n: int, m_star: float | None, lower: float, upper: float, *,
         status: str = "located", regime: str = "independent",
         resolution: float = 1.1) -> CurveCell:
    """A :class:`CurveCell` with the given reading and interval (the curve is a stand-in)."""
    ms = (1.0, float(n))
    return CurveCell(regime, n, ms, (0, 1, 2), (0.0, 1.0), (0.0, 1.0), "isotonic", "planted",
                     None, Isotonic(ms, (0.0, 1.0)), 0.01, status, m_star, lower, upper,
                     resolution, True, 10, ())


def arm_rows(n: int, batch: int, control_batch: int, curve: Any, *, depends_on: str,
             seeds: int = 4, noise: float = 0.002, level: float = -0.01, seed: int = 0,
             fractions: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 1.0),
             regimes: tuple[str, ...] = ("shared", "independent")) -> list[dict[str, Any]]:
    """Main-arm rows (``batch``) and control-arm rows (``control_batch``, ``arm = control``)
    at one ``n`` whose metric ``score`` is ``curve(m)`` (``depends_on = "m"``) or ``curve`` of
    the main arm's m at the same ``k = B m / n`` (``"k"``: the control at m scores
    ``curve(m control_batch / batch)``), plus a shared seed level, the control's ``level``
    shift and noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for regime in regimes:
        levels = rng.normal(0, 0.02, size=seeds)
        for s in range(seeds):
            for f in fractions:
                m = max(1, round(f * n))
                for arm, b in (("main", batch), ("control", control_batch)):
                    x = m if depends_on == "m" or arm == "main" else m * b / batch
                    value = float(curve(x)) + levels[s] + rng.normal(0, noise)
                    row = {"regime": regime, "n": n, "m": m, "seed": s,
                           "score": value + (level if arm == "control" else 0.0)}
                    if arm == "control":
                        row.update(arm="control", batch_size=b)
                    rows.append(row)
    return rows
