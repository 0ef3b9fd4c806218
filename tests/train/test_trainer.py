"""The Trainer and its step strategies: the strategy is chosen once and is all the loop asks
about; a strategy of one's own plugs in; a lone run driven by hand equals fit; several runs with
their own RNG streams under the one-pass step each train as alone; bad inputs are refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from crl.errors import CrlValueError
from crl.train import (
    NonFiniteLossError,
    RunWriter,
    Trainer,
    TrainingRun,
    build_step,
    fit,
    load_config,
)
from crl.train.checkpoint import rng_state
from crl.train.grouped import OwnRng
from crl.train.step import Learner, StepLoss
from crl.train.steps import CachedStep, SingleStep

CPU = torch.device("cpu")
_BASE = ["data.num_train=64", "data.synthetic.num_samples=120", "train.batch_size=16",
         "train.steps=6", "train.log_every=2", "train.checkpoint_every=3", "model.kind=mlp",
         "model.embed_dim=8", "model.hidden_dim=16", "eval.probe=false"]


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    """One torch thread for fit and for the trainers built by hand alike (fit only sets it
    from ``train.num_threads``): the reductions then sum in the same order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
            for line in lines]


def test_build_step_is_the_one_choice() -> None:
    assert isinstance(build_step(), SingleStep)
    cached = build_step(4, "bf16")
    assert isinstance(cached, CachedStep) and cached.micro_batch_size == 4


def test_a_strategy_of_ones_own_plugs_into_the_loop(tmp_path: Path) -> None:
    """A strategy that wraps the one-pass step: the loop calls it once per step with the runs,
    and the run equals fit's."""
    cfg = load_config("synthetic-gaussian", _BASE)
    calls: list[int] = []

    class Counting:
        def __init__(self) -> None:
            self.inner = SingleStep()

        def __call__(self, learners: Any, batch: Any) -> list[StepLoss]:
            calls.append(len(learners))
            return self.inner(learners, batch)

    with RunWriter(tmp_path / "by-hand") as writer:
        run = TrainingRun.start(cfg, writer, CPU)
        [result] = Trainer([run], Counting()).train()
    assert calls == [1] * 6 and result.finished and result.step == 6
    alone = fit(cfg, tmp_path / "fit", progress=False)
    assert _records(tmp_path / "by-hand") == _records(tmp_path / "fit")
    assert {k: v for k, v in result.summary.items() if not k.startswith("time/")} == \
        {k: v for k, v in alone.summary.items() if not k.startswith("time/")}


class _Noisy:
    """The one-pass step, and a draw from each learner's RNG context put into its logs."""

    def __init__(self) -> None:
        self.inner = SingleStep()

    def __call__(self, learners: list[Learner], batch: Any) -> list[StepLoss]:
        out = self.inner(learners, batch)
        for run, (_, logs) in zip(learners, out, strict=True):
            with run.rng:
                logs["noise"] = float(torch.rand(()))
        return out


def test_runs_with_their_own_rng_streams_train_as_alone(tmp_path: Path) -> None:
    """Two runs in one trainer (on the same batches), each in its own RNG stream (as
    fit_group's), draw and step as each does alone."""
    configs = [load_config("synthetic-gaussian", [*_BASE, f"loss.temperature={t}"])
               for t in (0.1, 0.5)]
    for i, config in enumerate(configs):
        with RunWriter(tmp_path / f"alone{i}") as writer:
            Trainer([TrainingRun.start(config, writer, CPU)], _Noisy()).train()
    runs = [TrainingRun.start(config, RunWriter(tmp_path / f"together{i}"), CPU,
                              rng=OwnRng(rng_state())) for i, config in enumerate(configs)]
    Trainer(runs, _Noisy()).train()
    for i in range(2):
        assert _records(tmp_path / f"alone{i}") == _records(tmp_path / f"together{i}")
    noise = [r["noise"] for r in _records(tmp_path / "together1") if "noise" in r]
    assert len(noise) == 3  # the draws of steps 2, 4 and 6 (the records)
    assert _records(tmp_path / "alone0") != _records(tmp_path / "alone1")


@pytest.mark.parametrize("other", ["train.steps=9", "train.seed=1", "train.sampler=no_duplicates",
                                   "data.seed=3"])
def test_the_trainer_refuses_runs_not_in_lockstep(other: str, tmp_path: Path) -> None:
    with pytest.raises(CrlValueError, match="at least one"):
        Trainer([], SingleStep())
    configs = [load_config("synthetic-gaussian", _BASE),
               load_config("synthetic-gaussian", [*_BASE, other])]
    runs = [TrainingRun.start(c, RunWriter(tmp_path / f"r{i}"), CPU)
            for i, c in enumerate(configs)]
    with pytest.raises(CrlValueError, match="run 1 differs from the first in its"):
        Trainer(runs, SingleStep())


def test_a_non_finite_loss_names_the_step_and_the_last_checkpoint(tmp_path: Path) -> None:
    class Poisoned:
        def __init__(self) -> None:
            self.inner = SingleStep()

        def __call__(self, learners: list[Learner], batch: Any) -> list[StepLoss]:
            out = self.inner(learners, batch)
            if learners[0].step == 4:  # the fifth step
                raise NonFiniteLossError("the training loss is nan at step 5")
            return out

    cfg = load_config("synthetic-gaussian", _BASE)
    with RunWriter(tmp_path / "run") as writer:
        trainer = Trainer([TrainingRun.start(cfg, writer, CPU)], Poisoned())
        with pytest.raises(NonFiniteLossError, match=r"at step 5;.*checkpoint.pt at step 3"):
            trainer.train()
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["step"] == 3
