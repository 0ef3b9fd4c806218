"""The inner-error rates of both regimes on an exact model, beside the trained runs
(docs/theory.md §5): ``1/m`` for independent negatives, ``1/sqrt(m)`` for a shared set.

The simulation is cached in the study directory (``theory_check.json``), so a report stays
rebuildable from the files alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

THEORY_FILE = "theory_check.json"


def theory_check(study_dir: Path, preset: str) -> dict[str, Any]:
    """Inner-error RMS against m and its fitted exponent, per regime, at a fixed mild scorer of
    a random 2 x 6 tabular model (read from the cache when present)."""
    path = study_dir / THEORY_FILE
    if path.exists():
        cached: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return cached
    import torch

    from crl.rundir import write_json
    from crl.theory import TabularModel, fit_rate, inner_outer_error

    rng = np.random.default_rng(12)
    model = TabularModel([0.3, 0.7], rng.dirichlet(np.ones(6), size=2))
    table = 0.5 * rng.normal(size=(2, 6))
    small = preset == "smoke"
    ms = [8, 32, 128] if small else [8, 16, 32, 64, 128]
    out: dict[str, Any] = {"model": "a random 2 x 6 tabular model, scores 0.5 N(0, 1)",
                           "tau": 1.0, "m": ms}
    # Independent negatives: n >> m, the RMS is the 1/m bias. Shared: the fluctuation of the one
    # shared sample, 1/sqrt(m), which repetitions must resolve.
    settings = {"independent": (2000 if small else 20_000, 3 if small else 6),
                "shared": (400 if small else 800, 10 if small else 80)}
    threads = torch.get_num_threads()
    # One thread: the same numbers on any machine (a reduction split over threads rounds
    # otherwise), and less CPU: the extra threads of these small ops mostly wait.
    torch.set_num_threads(1)
    try:
        for key, (n, repetitions) in settings.items():
            generator = torch.Generator().manual_seed(0 if key == "independent" else 1)
            rms = [inner_outer_error(model, table, 1.0, n=n, m=m, shared=key == "shared",
                                     repetitions=repetitions, generator=generator).inner_rms
                   for m in ms]
            rate = fit_rate(ms, rms)
            out[key] = {"n": n, "repetitions": repetitions, "inner_rms": rms,
                        "exponent": rate.exponent, "ci": [rate.low, rate.high]}
    finally:
        torch.set_num_threads(threads)
    write_json(path, out)
    return out


def theory_text(theory: dict[str, Any], betas: dict[str, list[float]]) -> str:
    """The comparison of the fitted decay exponents with the exact model's, in words."""
    parts = []
    for regime, expected in (("independent", 1.0), ("shared", 0.5)):
        mine = [b for b in betas.get(regime, []) if np.isfinite(b)]
        exact = theory.get(regime, {})
        if mine:
            parts.append(f"On this data, the fitted decay exponents beta of the {regime} "
                         f"regime range over {min(mine):.2f} to {max(mine):.2f}.")
        if exact:
            lo, hi = exact["ci"]
            parts.append(f"On an exact model ({theory['model']}, n = {exact['n']}), the "
                         f"inner-error RMS of the {regime} regime falls "
                         f"like m^-{exact['exponent']:.2f} (95% CI {lo:.2f} to {hi:.2f}; theory: "
                         f"{expected:g}).")
    parts.append("The beta of a trained model mixes the inner error with optimisation and the "
                 "outer error, so it need not equal the theoretical rate; the exact model "
                 "isolates the inner error.")
    return " ".join(parts)
