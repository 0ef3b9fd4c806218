"""A study fills a missing data cache once, before its runs start: with three pycode runs and an
empty cache, the pairs are mined once (in ``run_study``, before the executor), and every run
finds the cache already on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crl.data import pycode
from crl.experiments.runner import run_study
from crl.experiments.study import Analysis, RunSpec, Study
from crl.rundir import write_json

SOURCE = 'def area(r):\n    """Return the area of a circle of radius r."""\n    return 3 * r * r\n'


class _PycodeRuns(Study):
    name = "pycode-cache-check"

    def __init__(self, root: Path, cache: Path) -> None:
        super().__init__("smoke")
        self.root, self.cache = root, cache

    def runs(self) -> list[RunSpec]:
        data = {"name": "pycode", "pycode": {"roots": [str(self.root)],
                                             "cache_dir": str(self.cache)}}
        return [RunSpec({"data": data, "run": i}, {"run": i}, label=f"r{i}") for i in range(3)]

    def execute(self, spec: RunSpec, run_dir: Path, *, resume: bool) -> None:
        cached = sorted((self.cache / "pycode").glob("pairs-*.jsonl"))
        write_json(run_dir / "summary.json", {"cache_was_there": bool(cached)})

    def analyze(self, rows: list[dict[str, Any]], study_dir: Path) -> Analysis:
        raise NotImplementedError  # not reached: run_study does not analyse


def test_a_study_mines_its_pycode_cache_once_before_the_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = pycode.mine_pairs

    def counted(*args: Any, **kwargs: Any) -> pycode.MinedPairs:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pycode, "mine_pairs", counted)
    monkeypatch.setattr(pycode, "_MEMO", {})
    root = tmp_path / "src"
    root.mkdir()
    (root / "m.py").write_text(SOURCE)
    study = _PycodeRuns(root, tmp_path / "cache")
    outcome = run_study(study, tmp_path / "out", workers=1, progress=False)
    assert outcome.completed == 3 and not outcome.failed
    assert len(calls) == 1
    summaries = sorted((tmp_path / "out" / study.name).glob("*/summary.json"))
    assert len(summaries) == 3
    assert all('"cache_was_there": true' in path.read_text() for path in summaries)
