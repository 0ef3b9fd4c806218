"""A checkpoint runs no code: one whose pickle would create a file when loaded is refused by
``crl eval`` and ``crl train --resume`` with one line and exit code 2, and the file is not
created; a real checkpoint holds only what ``torch.load(weights_only=True)`` accepts."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from crl.cli import app
from crl.train import config_hash, fit, load_config
from crl.train.checkpoint import CHECKPOINT_KEYS, rng_state, set_rng_state

TINY = ["data.num_train=64", "data.synthetic.num_samples=128", "train.batch_size=16",
        "train.steps=4", "train.checkpoint_every=2", "train.log_every=1", "train.num_threads=1",
        "eval.ks=[1]", "eval.probe=false"]


class _CreatesFile:
    """Unpickling this calls ``open(path, "w")``: the file appears if the pickle is trusted."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def _hostile_checkpoint(path: Path, marker: Path) -> None:
    state: dict[str, Any] = {key: 0 for key in CHECKPOINT_KEYS}
    state["rng"] = _CreatesFile(marker)
    torch.save(state, path)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(out, run)``: a run of ``crl train synthetic-gaussian`` stopped at step 2."""
    out = tmp_path_factory.mktemp("out")
    config = load_config("synthetic-gaussian", TINY)
    run = out / f"synthetic-gaussian-{config_hash(config)}"
    fit(config, run, progress=False, stop_at=2)
    return out, run


def test_the_hostile_checkpoint_does_run_code_when_trusted(tmp_path: Path) -> None:
    # The payload is live: an unguarded torch.load creates the file (so the tests below can fail).
    marker = tmp_path / "created"
    _hostile_checkpoint(tmp_path / "checkpoint.pt", marker)
    torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("command", ["eval", "resume"])
def test_hostile_checkpoint_is_refused_and_runs_nothing(stopped: tuple[Path, Path],
                                                        tmp_path: Path, command: str) -> None:
    out, run = stopped
    marker = tmp_path / "created"
    checkpoint = run / "checkpoint.pt"
    good = checkpoint.read_bytes()
    try:
        _hostile_checkpoint(checkpoint, marker)
        args = (["eval", str(run)] if command == "eval" else
                ["train", "synthetic-gaussian", *[a for o in TINY for a in ("--set", o)],
                 "--out", str(out), "--resume", "--no-progress"])
        result = CliRunner().invoke(app, args)
    finally:
        checkpoint.write_bytes(good)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: checkpoint "), result.output
    assert "other than tensors and plain values" in lines[0] and "GLOBAL io.open" in lines[0]
    assert not marker.exists(), "loading the checkpoint ran its code"


def test_real_checkpoint_loads_with_weights_only(stopped: tuple[Path, Path]) -> None:
    state = torch.load(stopped[1] / "checkpoint.pt", weights_only=True)
    assert set(CHECKPOINT_KEYS) <= set(state)


def test_rng_state_round_trips_through_weights_only_load(tmp_path: Path) -> None:
    random.seed(3)
    np.random.seed(4)  # noqa: NPY002
    np.random.standard_normal()  # noqa: NPY002  (a cached gaussian in numpy's state)
    torch.manual_seed(5)
    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = (random.random(), np.random.standard_normal(3), torch.rand(3))  # noqa: NPY002
    random.seed(0)
    np.random.seed(0)  # noqa: NPY002
    torch.manual_seed(0)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = (random.random(), np.random.standard_normal(3), torch.rand(3))  # noqa: NPY002
    assert got[0] == expected[0]
    np.testing.assert_array_equal(got[1], expected[1])
    assert torch.equal(got[2], expected[2])
