"""Re-analyse a ``crl study negatives`` results.csv with the curve-based statistics (issue 25):
m* per cell read from fitted curves with exact seed resampling, the law m*(n) per regime tested
for fit (with and without its censored cells), the recommendation rule, the backtest, the
theory's verdict per regime, and the tolerance sensitivity (half / chosen / twice).

Run from the repository root:

    .venv/bin/python benchmarks/reanalyse_negatives.py docs/results/negatives-full/results.csv \\
        [--metric recall@1] [--tolerance 0.01] [--target-n 17908]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from crl.experiments.metrics import metric_spec, metric_value
from crl.experiments.negatives.answer import Answer, answer_from_cells, tolerance_sensitivity
from crl.experiments.negatives.curves import curve_cells, where_to_refine
from crl.experiments.negatives.tolerance import Tolerance
from crl.experiments.negatives.verdict import interval_text
from crl.experiments.results import read_results


def _m(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:,.0f}"


def _ci(lo: float, hi: float) -> str:
    return f"[{_m(lo)}, {_m(hi)}]"


def print_answer(result: Answer) -> None:
    """Print one :class:`Answer` as plain text."""
    print(f"tolerance {result.tolerance}, target n = {result.target_n:,}")
    print("  cells: regime n | method | status m* [95% seeds] | grid ratio | resamples")
    for c in result.cells:
        print(f"    {c.regime:11s} {c.n:6d} | {c.method:10s} | {c.status:7s} {_m(c.m_star):>6s} "
              f"{_ci(c.lower, c.upper):16s} | x{c.resolution:.2f} | "
              f"{c.num_resamples}{' exact' if c.exact else ''}")
    for regime, law in result.laws.items():
        located = result.laws_located[regime]
        print(f"  law {regime}: alpha {interval_text(law.alpha, law.alpha_ci)}, tau "
              f"{'-' if law.tau is None else format(law.tau, '.2f')}; {law.verdict}: "
              f"{law.reason}")
        print("    residuals: " + ", ".join(f"n={n}: {r:+.2f}" for n, r in law.residuals))
        alpha = interval_text(located.alpha, located.alpha_ci)
        print(f"    without censored cells: alpha {alpha}, {located.verdict}")
        rec = result.recommendations[regime]
        print(f"    recommendation ({rec.source}, n = {rec.n_used:,}): m {_m(rec.m)} "
              f"{_ci(rec.low, rec.high)}{' (extrapolation)' if rec.extrapolation else ''}")
        if regime in result.backtests:
            print(f"    backtest: {result.backtests[regime].reason}")
    for verdict in result.verdicts.values():
        print(f"  {verdict.sentence}")


def main() -> None:
    """Parse the arguments and print the analysis and the sensitivity table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--metric", default="recall@1")
    parser.add_argument("--tolerance", default="0.01")
    parser.add_argument("--target-n", type=int, default=17908)
    args = parser.parse_args()
    spec = metric_spec(args.metric)
    tolerance = Tolerance.parse(args.tolerance)
    rows = read_results(args.results)
    for row in rows:
        row[spec.name] = metric_value(row, spec.name)
    cells = curve_cells(rows, spec.name, spec.higher_is_better, tolerance)
    print_answer(answer_from_cells(cells, tolerance, args.target_n))
    print(f"  where to refine: {where_to_refine(cells)}")
    print("\nsensitivity to the tolerance:")
    for result in tolerance_sensitivity(rows, spec.name, spec.higher_is_better, tolerance,
                                        args.target_n):
        cells_text = ", ".join(f"{c.regime[:3]} {c.n}: {_m(c.m_star)}" for c in result.cells)
        laws = "; ".join(f"{r}: alpha {interval_text(law.alpha, law.alpha_ci)} ({law.verdict}), "
                         f"rec {_m(result.recommendations[r].m)} "
                         f"({result.recommendations[r].source})"
                         for r, law in result.laws.items())
        print(f"  {result.tolerance!s:>16s} | {cells_text}\n  {'':16s} | {laws}")


if __name__ == "__main__":
    main()
