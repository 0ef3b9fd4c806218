"""The executor registry: every engine declares its flags (a dataclass of ``Annotated[...,
Flag(...)]`` fields) and checks them itself; ``build_executor`` hands each engine only its own
flags, and the CLI's flags are the engines' declarations, so an engine added to ``ENGINES`` brings
its flags to ``crl study`` with no other edit. Tasks are typed by one protocol: a worker that
dies fails every run of its task (a single run or a group), each with its traceback."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Self

import pytest
import typer
from typer.testing import CliRunner

from crl.cli._executors import executor_options
from crl.errors import CrlValueError
from crl.experiments.executors import (
    ENGINES,
    EngineOptions,
    Executor,
    Flag,
    LocalExecutor,
    RunOutcome,
    Task,
    build_executor,
    engine_options,
)
from crl.experiments.study import RunSpec


@dataclass(frozen=True)
class ToyOptions(EngineOptions):
    toy_level: Annotated[int | None, Flag("toy: how hard the toy engine tries.")] = None
    toy_names: Annotated[list[str] | None, Flag("toy: names (repeatable).", metavar="NAME")] = None


class ToyExecutor(Executor):
    """An engine that exists only in this test: registered, it gets its flags everywhere."""

    kind = "toy"
    summary = "a toy engine"
    Options = ToyOptions

    def __init__(self, level: int, names: Sequence[str], workers: int | None) -> None:
        if level < 0:
            raise CrlValueError(f"--toy-level must be >= 0; got {level}")
        self.level, self.names, self.workers = level, list(names), workers

    @classmethod
    def from_options(cls, workers: int | None, options: ToyOptions) -> Self:
        return cls(options.toy_level or 0, options.toy_names or [], workers)

    def run(self, tasks: Sequence[Task], study_dir: Path) -> Iterator[RunOutcome]:
        yield from ()


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> type[ToyExecutor]:
    monkeypatch.setitem(ENGINES, "toy", ToyExecutor)
    return ToyExecutor


def test_every_flag_is_declared_by_one_engine_and_named_after_its_field() -> None:
    options = engine_options()
    assert {o.kind for o in options} == {"submitit", "ray"}  # local has --workers only
    assert len({o.name for o in options}) == len(options)
    for o in options:
        assert o.flag == "--" + o.name.replace("_", "-")
        assert o.help.startswith(f"{o.kind}: "), o  # the help says whose flag it is
        assert o.name in {f.name for f in dataclasses.fields(ENGINES[o.kind].Options)}
    assert [o.flag for o in options if o.kind == "submitit"] == [
        "--slurm-partition", "--slurm-time", "--slurm-gpus-per-run", "--slurm-setup",
        "--slurm-parameters"]
    assert all(ENGINES[kind].kind == kind and ENGINES[kind].summary for kind in ENGINES)


def test_an_unknown_flag_lists_the_valid_ones() -> None:
    with pytest.raises(CrlValueError, match=r"unknown option 'slurm_partiton'; valid are "
                                            r"gpus_per_run, ray_address, slurm_gpus_per_run"):
        build_executor("submitit", slurm_partiton="gpu")


def test_a_registered_engine_is_built_with_its_own_flags(toy: type[ToyExecutor]) -> None:
    executor = build_executor("toy", workers=3, toy_level=2, toy_names=["a", "b"])
    assert isinstance(executor, ToyExecutor)
    assert (executor.level, executor.names, executor.workers) == (2, ["a", "b"], 3)
    with pytest.raises(CrlValueError, match="--toy-level must be >= 0; got -1"):
        build_executor("toy", toy_level=-1)  # the engine checks its own settings
    with pytest.raises(CrlValueError, match="--toy-level: a setting of --executor toy, not of "
                                            "--executor ray"):
        build_executor("ray", toy_level=1)
    with pytest.raises(CrlValueError, match="--gpus-per-run: a setting of --executor ray, not "
                                            "of --executor toy"):
        build_executor("toy", gpus_per_run=1)


def test_the_cli_flags_are_the_engines_declarations(toy: type[ToyExecutor]) -> None:
    seen: dict[str, Any] = {}

    def command(workers: int | None = typer.Option(None, "--workers"),
                executor: Executor | None = None) -> None:
        seen["executor"] = executor

    app = typer.Typer()
    app.command()(executor_options(command))
    runner = CliRunner()
    result = runner.invoke(app, ["--executor", "toy", "--toy-level", "4", "--toy-names", "x",
                                 "--toy-names", "y", "--workers", "2"])
    assert result.exit_code == 0, result.output
    executor = seen["executor"]
    assert isinstance(executor, ToyExecutor)
    assert (executor.level, executor.names, executor.workers) == (4, ["x", "y"], 2)
    result = runner.invoke(app, ["--toy-level", "4"])  # the default executor is local
    assert isinstance(result.exception, CrlValueError)
    assert str(result.exception) == ("--toy-level: a setting of --executor toy, not of "
                                     "--executor local")
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert "toy (a toy engine)" in result.output
    assert "--toy-names" in result.output and "NAME" in result.output


def test_flags_declared_twice_or_without_their_help_are_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclass(frozen=True)
    class Twice(EngineOptions):
        ray_address: Annotated[str | None, Flag("toy: a second --ray-address.")] = None

    @dataclass(frozen=True)
    class Bare(EngineOptions):
        toy_level: int | None = None

    for options, message in ((Twice, "declared twice"), (Bare, r"Bare.toy_level must be "
                                                               r"annotated Annotated")):
        engine = type("Engine", (ToyExecutor,), {"Options": options})
        monkeypatch.setitem(ENGINES, "toy", engine)
        with pytest.raises(TypeError, match=message):
            engine_options()


@pytest.mark.parametrize(("kind", "settings", "message"), [
    ("local", {"workers": 0}, "--workers must be an integer >= 1; got 0"),
    ("ray", {"gpus_per_run": -1}, "ray: --gpus-per-run must be an integer >= 0; got -1"),
    ("ray", {"ray_address": "auto", "workers": 2}, "--workers sets the CPUs of the local Ray"),
    ("submitit", {"slurm_time": "0"}, "--slurm-time must be a positive time limit; got '0'"),
    ("submitit", {"slurm_partition": "gpu"}, "submitit's local cluster takes no partition"),
])
def test_each_engine_checks_its_own_flags(kind: str, settings: dict[str, Any], message: str,
                                          tmp_path: Path) -> None:
    module = ENGINES[kind].requires
    if module is not None:
        pytest.importorskip(module[0])
    if kind == "submitit":  # submitit's local cluster: no Slurm needed here
        (tmp_path / "local.yaml").write_text("cluster: local\n")
        settings = {**settings, "slurm_parameters": tmp_path / "local.yaml"}
    with pytest.raises(CrlValueError) as info:
        build_executor(kind, **settings)
    assert message in str(info.value)


@dataclass(frozen=True)
class DyingTask:
    """A task whose worker process dies (as one killed by the OOM killer would)."""

    specs: tuple[RunSpec, ...]
    run_dirs: tuple[Path, ...]
    threads: int | None = None
    study: Any = None

    def with_threads(self, threads: int | None) -> Self:
        return replace(self, threads=threads)

    def run(self) -> list[RunOutcome]:
        os._exit(1)


def test_a_dead_worker_fails_every_run_of_its_task(tmp_path: Path) -> None:
    specs = [RunSpec({"x": i}, label=f"r{i}") for i in range(3)]
    dirs = [tmp_path / s.run_id for s in specs]
    tasks: list[Task] = [DyingTask((specs[0], specs[1]), (dirs[0], dirs[1])),
                         DyingTask((specs[2],), (dirs[2],))]
    outcomes = list(LocalExecutor(2).run(tasks, tmp_path))
    assert sorted(o.run_id for o in outcomes) == sorted(s.run_id for s in specs)
    assert all(not o.ran and o.error for o in outcomes)
    for run_dir in dirs:  # each run's traceback, as a run that failed by itself
        assert "Traceback" in (run_dir / "error.txt").read_text()
