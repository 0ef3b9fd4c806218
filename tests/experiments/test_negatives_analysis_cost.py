"""The analysis's speed-ups change no number: the law fits with each distinct maximisation made
once per process (``laws._maximised``, memoised) equal those made afresh, on the committed quick
study's results; the theory check's simulation is the same whatever the caller's torch thread
count (it runs on one thread) and leaves that count as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from crl.experiments.metrics import metric_value
from crl.experiments.negatives import laws
from crl.experiments.negatives.answer import tolerance_sensitivity
from crl.experiments.negatives.theory import theory_check
from crl.experiments.negatives.tolerance import Tolerance
from crl.experiments.results import read_results

QUICK = Path(__file__).resolve().parents[2] / "docs" / "results" / "negatives-quick"


def _rows() -> list[dict[str, Any]]:
    rows = [r for r in read_results(QUICK / "results.csv") if not r.get("stage")]
    for row in rows:
        row["recall@1"] = metric_value(row, "recall@1")
    return rows


def _answers() -> list[Any]:
    answers = tolerance_sensitivity(_rows(), "recall@1", True, Tolerance.parse("0.01"), 17908)
    return [(a.to_dict(), {r: b.to_dict() for r, b in a.backtests.items()},
             {r: x.to_dict() for r, x in a.recommendations.items()}) for a in answers]


def test_memoised_law_fits_equal_fresh_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    laws._maximised.cache_clear()
    memoised = _answers()
    assert laws._maximised.cache_info().hits > 0  # repeated maximisations were answered
    again = _answers()  # every maximisation from the memo
    fresh_calls = []

    def fresh(obs: Any, fixed: dict[str, float]) -> tuple[float, dict[str, float]]:
        fresh_calls.append(1)
        return laws._maximised.__wrapped__(tuple(obs), tuple(sorted(fixed.items())))

    monkeypatch.setattr(laws, "_maximise", fresh)
    assert _answers() == memoised == again
    assert fresh_calls


def test_theory_check_is_the_same_on_any_caller_thread_count(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    out = []
    try:
        for count in (2, 1):
            torch.set_num_threads(count)
            folder = tmp_path / str(count)
            folder.mkdir()
            out.append(theory_check(folder, "smoke"))
            assert torch.get_num_threads() == count  # left as it was
    finally:
        torch.set_num_threads(threads)
    assert out[0] == out[1] and "independent" in out[0]
