"""``crl train --nproc N`` forwards its own command line, and a run joins the process group once."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from crl import distributed
from crl.cli import app
from crl.cli.train import without_nproc

runner = CliRunner()


def test_nproc_forwards_every_other_argument_unchanged(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    # An option added after the launcher was written (--micro-batch-size), repeated --set,
    # --nproc=N and --nproc N in odd places, a flag after the config: all but --nproc survive.
    argv = ["crl", "train", "synthetic-gaussian", "--set", "train.steps=3", "--nproc", "2",
            "--micro-batch-size", "4", "--set", "loss.name=clip", "--out", str(tmp_path),
            "--precision", "bf16", "--no-progress"]
    launched: list[tuple[int, list[str]]] = []

    def fake_launch(nproc: int, args: Sequence[str]) -> int:
        launched.append((nproc, list(args)))
        return 0

    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(distributed, "launch", fake_launch)
    result = runner.invoke(app, argv[1:])
    assert result.exit_code == 0, result.output
    expected = [a for a in argv[1:] if a not in ("--nproc", "2")]
    assert launched == [(2, expected)]
    assert not any(tmp_path.iterdir())  # the launcher itself trains nothing
    assert without_nproc(["crl", "--nproc=3", "train", "x"]) == ["train", "x"]


def test_a_run_joins_the_process_group_once(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    calls: list[str] = []
    real = distributed.init_from_env

    def counting(device: str = "cpu") -> bool:
        calls.append(device)
        return real(device)

    monkeypatch.setattr(distributed, "init_from_env", counting)
    result = runner.invoke(app, [
        "train", "synthetic-gaussian", "--smoke", "--out", str(tmp_path), "--no-progress",
        "--set", "train.steps=2", "--set", "train.num_threads=1", "--set", "eval.probe=false",
        "--micro-batch-size", "8", "--precision", "bf16"])
    assert result.exit_code == 0, result.output
    assert calls == ["cpu"]
    (run,) = tmp_path.iterdir()
    assert '"micro_batch_size": 8' in (run / "config.json").read_text()


def test_bad_precision_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "synthetic-gaussian", "--precision", "fp16",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 2 and "train.precision" in result.output
    assert not any(tmp_path.iterdir())
