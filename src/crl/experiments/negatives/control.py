"""The control arm of ``crl study negatives``: does the curve follow m, or the negatives an
anchor meets per step? (docs/negatives.md, "The control arm: m or k"; docs/theory.md §7,
"m or k").

With GCL at batch ``B`` an anchor meets ``k = B m / n`` of its m negatives per step, so along
one batch size m and k move together. The control arm trains the same n and the same m at a
second batch ``B_c = B / r`` (same seeds, same training), where ``k`` is ``r`` times smaller
at every m. Two hypotheses predict the control curve from the main one (scores oriented so that
higher is better, ``main(.)`` interpolated linearly in ``log m`` between swept m):

- *follows m*: ``control(m) = main(m) + c`` (a level shift ``c`` from the batch itself);
- *follows k*: ``control(m) = main(m / r) + c`` (the main arm at the same k).

Both are nested in ``D(m) = c + b S(m)`` with ``D = control(m) - main(m)`` and
``S = main(m / r) - main(m)``, the change the k hypothesis predicts: ``b = 0`` is "follows m",
``b = 1`` "follows k". ``b`` is the least-squares slope over the control's m whose ``m / r``
lies in the main arm's swept range, ``S`` from the main arm's seed-adjusted means. Its 95%
interval is Student's t over the seeds' own slopes ``b_s`` (each seed's ``D_s`` paired across
the arms, on the common ``S``; their mean is ``b``): with 3 to 6 seeds a bootstrap over seeds
is too narrow for a slope, and the t interval is not. The noise of ``S`` itself is common to
every ``b_s`` and not in the interval; it can push the interval past both 0 and 1, which is
read as "cannot tell", never as the other hypothesis.

``main(m / r)`` between swept m is an interpolation, which biases ``b`` a little (a planted
exact 1 reads about 1.05 on a grid with steps of 2 to 2.5), so the verdict asks which hypothesis
``b`` is decisively nearer, not for an exact 0 or 1: ``m`` when the interval lies in
``(-1/2, 1/2)``, ``k`` when it lies in ``(1/2, 3/2)``, else ``cannot tell`` (it holds 1/2, it
lies beyond both, or the main curve is flat there, so that the two predict the same curve within
the tolerance). On planted tables (tests/experiments/test_negatives_control.py) with 3 to 6
seeds, a curve in m was never read as k, nor the reverse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from crl.experiments.negatives.curves import cell_tables
from crl.experiments.negatives.stats import FloatArray, additive_means
from crl.experiments.negatives.tolerance import Tolerance

#: The control arm's batch is the main arm's divided by this.
BATCH_RATIO = 4


def control_batch(batch: int) -> int:
    """The control arm's batch for a main batch ``batch`` (at least 2).

    Example:
        >>> control_batch(128), control_batch(4)
        (32, 2)
    """
    return max(2, batch // BATCH_RATIO)


@dataclass(frozen=True)
class ControlResult:
    """What the control arm says for one regime (see the module docstring).

    Attributes:
        regime, n: The cell. batch, control_batch: The two batch sizes; ratio: their ratio r.
        ms: The control's m that enter the test. seeds: The paired seeds.
        slope, interval: ``b`` and its 95% interval (NaN when not estimable). level: ``c``.
        spread: The largest ``|S(m)|``, how far apart the two hypotheses' predictions are.
        verdict: ``m``, ``k`` or ``cannot tell``. reason: Why, in words.
        per_seed: Each seed's slope ``b_s`` (their mean is ``slope``).
    """

    regime: str
    n: int
    batch: int
    control_batch: int
    ratio: float
    ms: tuple[float, ...]
    seeds: tuple[int, ...]
    slope: float
    interval: tuple[float, float]
    level: float
    spread: float
    verdict: str
    reason: str
    per_seed: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN as None)."""
        def num(v: float) -> float | None:
            return v if math.isfinite(v) else None
        return {"regime": self.regime, "n": self.n, "batch_size": self.batch,
                "control_batch_size": self.control_batch, "ratio": self.ratio,
                "ms": list(self.ms), "seeds": list(self.seeds), "slope": num(self.slope),
                "interval": [num(self.interval[0]), num(self.interval[1])],
                "level": num(self.level), "spread": self.spread, "verdict": self.verdict,
                "reason": self.reason, "per_seed": [num(b) for b in self.per_seed],
                "num_ms": len(self.ms), "num_seeds": len(self.seeds)}


def _shift(ms_main: FloatArray, main: FloatArray, ms: FloatArray, ratio: float
           ) -> tuple[FloatArray, FloatArray]:
    """``(main(m), S(m))`` at the control's ``ms`` ``(K,)`` from the main means ``(M,)`` at
    ``ms_main``: linear in ``log m`` between swept m."""
    logs = np.log(ms_main)
    here = np.interp(np.log(ms), logs, main)
    return here, np.interp(np.log(ms / ratio), logs, main) - here


def _slopes(s: FloatArray, d: FloatArray) -> FloatArray:
    """The least-squares slope of each row of ``d`` ``(S, K)`` on ``s`` ``(K,)`` (NaN when
    ``s`` is constant)."""
    centred = s - s.mean()
    var = float(np.sum(centred ** 2))
    if var <= 1e-18:
        return np.full(d.shape[0], np.nan)
    return np.asarray((d - d.mean(axis=1, keepdims=True)) @ centred / var, dtype=np.float64)


def _verdict(interval: tuple[float, float], spread: float, tol: float) -> tuple[str, str]:
    lo, hi = interval
    if spread <= tol:
        return "cannot tell", (f"the main curve moves by at most {spread:.3g} between m / r and "
                               f"m, within the tolerance {tol:.3g}: m and k predict the same")
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "cannot tell", "the slope has no interval (one seed, or a flat main curve)"
    if lo <= 0.5 <= hi:
        return "cannot tell", "the interval holds 1/2, halfway between m (0) and k (1)"
    if -0.5 < lo and hi < 0.5:
        return "m", "the interval lies nearer 0 (follows m) than 1 (follows k)"
    if 0.5 < lo and hi < 1.5:
        return "k", "the interval lies nearer 1 (follows k) than 0 (follows m)"
    return "cannot tell", "the interval lies beyond both 0 (m) and 1 (k): neither alone"


def control_result(main_rows: list[dict[str, Any]], control_rows: list[dict[str, Any]],
                   metric: str, higher: bool, tolerance: Tolerance, *, regime: str, n: int,
                   batch: int, control_batch: int) -> ControlResult | None:
    """The :class:`ControlResult` of one regime at ``n`` (None without runs in both arms at
    >= 3 usable m, the fewest that leave the slope a residual)."""
    main = cell_tables(main_rows, metric, higher).get((regime, n))
    ctrl = cell_tables(control_rows, metric, higher).get((regime, n))
    if main is None or ctrl is None:
        return None
    ratio = batch / control_batch
    ms_main, seeds_main, t_main = main
    ms_c, seeds_c, t_c = ctrl
    seeds = tuple(s for s in seeds_c if s in seeds_main)
    use = [j for j, m in enumerate(ms_c) if m in ms_main and m / ratio >= ms_main[0]]
    if len(seeds) < 1 or len(use) < 3:
        return None
    t_main = t_main[[seeds_main.index(s) for s in seeds]]  # (S, M), paired seeds
    t_c = t_c[[seeds_c.index(s) for s in seeds]][:, use]  # (S, K)
    grid, ms = np.asarray(ms_main), np.asarray([ms_c[j] for j in use])
    means = additive_means(t_main)
    shift = _shift(grid, means, ms, ratio)[1]
    # Each seed's own differences D_s (S, K), paired: its control runs against its main runs
    # at the same m (every used m is a swept m of the main arm).
    d = t_c - t_main[:, [ms_main.index(ms_c[j]) for j in use]]
    d = d[np.isfinite(d).all(axis=1)]
    per_seed = _slopes(shift, d)
    b = float(per_seed.mean()) if len(per_seed) else math.nan
    level = float(np.mean(d) - b * shift.mean()) if len(per_seed) else math.nan
    if len(per_seed) >= 2 and np.isfinite(per_seed).all():
        half = float(sps.t.ppf(0.975, len(per_seed) - 1) * per_seed.std(ddof=1)
                     / math.sqrt(len(per_seed)))
        interval = (b - half, b + half)
    else:
        interval = (math.nan, math.nan)
    spread = float(np.max(np.abs(shift)))
    verdict, reason = _verdict(interval, spread, tolerance.points(float(np.max(means))))
    return ControlResult(regime, n, batch, control_batch, ratio, tuple(float(m) for m in ms),
                         seeds, b, interval, level, spread, verdict, reason,
                         tuple(float(x) for x in per_seed))


def control_text(r: ControlResult) -> str:
    """One regime's control arm in a sentence (every number is in ``analysis.json``)."""
    def num(v: float) -> str:
        return f"{v:.2f}" if math.isfinite(v) else "—"
    follows = {"m": "the curve follows m (the negative set), not k",
               "k": "the curve follows k = B m / n (the negatives per step), not m",
               "cannot tell": "the arm cannot tell m from k"}[r.verdict]
    return (f"Control arm, {r.regime} sets at n = {r.n:,}: the same m at batch "
            f"{r.control_batch} against {r.batch} (k {r.ratio:g} times smaller). With "
            f"D = c + b S (b = 0: follows m; b = 1: follows k), b = {num(r.slope)} "
            f"[{num(r.interval[0])}, {num(r.interval[1])}] over {len(r.ms)} m and "
            f"{len(r.seeds)} paired seeds (Student's t over the seeds' own slopes), level "
            f"shift c = "
            f"{num(r.level)}: {follows} ({r.reason}).")
