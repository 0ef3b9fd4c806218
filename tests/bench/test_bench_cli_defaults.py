"""``crl bench`` writes under ``runs/bench/`` unless ``--out`` names a file: a default run never
rewrites the tracked ``benchmarks/results/*.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import crl.bench
from crl.bench.loss import BATCH_SIZES, QUICK_BATCH_SIZES
from crl.cli import app


def _fake_retrieval(**_: Any) -> dict[str, Any]:
    return {"crl": {"seconds": 1.0, "metrics": {}}, "faiss": {"seconds": 2.0, "metrics": {}},
            "time_ratio_crl_vs_faiss": 0.5}


def test_default_out_is_under_runs_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(crl.bench, "run_retrieval_benchmark", _fake_retrieval)
    result = CliRunner().invoke(app, ["bench", "retrieval", "--quick"])
    assert result.exit_code == 0, result.output
    written = tmp_path / "runs" / "bench" / "retrieval.json"
    assert json.loads(written.read_text())["time_ratio_crl_vs_faiss"] == 0.5
    assert not (tmp_path / "benchmarks").exists()


def test_every_bench_default_out_is_untracked() -> None:
    bench = typer.main.get_group(app).commands["bench"]
    assert isinstance(bench, typer.core.TyperGroup)
    for name, command in bench.commands.items():
        (out,) = [p for p in command.params if p.name == "out"]
        assert Path(str(out.default)).parts[:2] == ("runs", "bench"), name


def test_bench_help_states_the_default_batch_sizes() -> None:
    loss = typer.main.get_group(app).commands["bench"].commands["loss"]  # type: ignore[attr-defined]
    (sizes,) = [p for p in loss.params if p.name == "batch_sizes"]
    assert ",".join(map(str, BATCH_SIZES)) in sizes.help
    assert f"with --quick: {','.join(map(str, QUICK_BATCH_SIZES))}" in sizes.help
    texts = [CliRunner().invoke(app, ["bench", *sub, "--help"]).output
             for sub in ([], ["loss"], ["retrieval"])]
    assert all("issue" not in text for text in texts)
