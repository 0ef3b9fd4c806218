"""The study executors: runs of the smoke grid through submitit (its local executor; every job
gets the time-limit signal once it has checkpointed, is requeued and resumes) and through a local
Ray with 2 CPUs give the summaries of the local executor bit for bit (every metric but timings),
and an interrupted grid continues where it stopped under each executor: a finished run is
skipped, a half-done one resumes from its checkpoint. The flags' checks and the Slurm script they
make need no engine."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from crl.cli import app
from crl.errors import CrlValueError
from crl.experiments.executors import (
    Executor,
    LocalExecutor,
    RunTask,
    build_executor,
    check_gpus,
    require_extra,
)
from crl.experiments.negatives import NegativesStudy
from crl.experiments.registry import get_study, study_names
from crl.experiments.runner import run_study
from crl.experiments.study import RunSpec
from crl.rundir import read_jsonl
from crl.train import fit, validate_config

#: Unique runs of the synthetic smoke grid used here (its n = 64 column starts with them).
RUNS = 3
#: The step an interrupted attempt stops at (the smoke runs have 16 steps).
HALF = 8
#: A record only an interrupted attempt wrote: it survives a resume, not a restart.
MARKER = {"step": 2, "marker": "first attempt"}


class SmokeRuns(NegativesStudy):
    """The first runs of the synthetic smoke grid of ``crl study negatives``."""

    def __init__(self) -> None:
        super().__init__("smoke", data="synthetic")

    def runs(self) -> list[RunSpec]:
        specs = super().runs()
        keep = list(dict.fromkeys(s.run_id for s in specs))[:RUNS]
        return [s for s in specs if s.run_id in keep]


class TimeLimitedRuns(SmokeRuns):
    """Each run's first job trains to step HALF (a checkpoint), writes its pid to ``waiting``
    and idles until the time-limit signal ends it; the requeued job resumes.
    ``attempts.jsonl`` records every job of a run."""

    def execute(self, spec: RunSpec, run_dir: Path, *, resume: bool) -> None:
        log = run_dir / "attempts.jsonl"
        first = not log.exists()
        with open(log, "a") as handle:
            handle.write(json.dumps({"resume": resume,
                                     "checkpoint": (run_dir / "checkpoint.pt").exists()}) + "\n")
        if first:
            config = validate_config(spec.config, origin="test")
            fit(config, run_dir, resume=resume, stop_at=HALF, progress=False)
            (run_dir / "waiting").write_text(str(os.getpid()))
            time.sleep(300)  # the time limit's signal ends this job (submitit requeues it)
        super().execute(spec, run_dir, resume=resume)


def _ship_this_module() -> None:
    """Job and task processes do not import tests/: pickle this module's studies by value."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if importlib.util.find_spec("ray") is not None:
        import ray.cloudpickle

        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _summaries(study_dir: Path) -> dict[str, dict[str, Any]]:
    return {p.parent.name: {k: v for k, v in json.loads(p.read_text()).items()
                            if not k.startswith("time/")}
            for p in study_dir.glob("*/summary.json")}


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The study directory of the runs through the local executor, in this process with one
    thread (as every executor below gives each run)."""
    out = tmp_path_factory.mktemp("local")
    with _one_thread():
        outcome = run_study(SmokeRuns(), out, progress=False, executor=LocalExecutor(1))
    assert outcome.completed == RUNS and not outcome.failed
    return out / "negatives"


def _interrupted_grid(out: Path, reference: Path) -> tuple[str, str]:
    """A grid left by an earlier attempt: its first run finished (as in ``reference``), its
    second stopped at step HALF with a checkpoint (and a record that a restart would drop)."""
    study = SmokeRuns()
    done, half = list(dict.fromkeys(s.run_id for s in study.runs()))[:2]
    shutil.copytree(reference / done, out / "negatives" / done)
    spec = next(s for s in study.runs() if s.run_id == half)
    with _one_thread():
        fit(validate_config(spec.config, origin="test"), out / "negatives" / half,
            stop_at=HALF, progress=False)
    with open(out / "negatives" / half / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps(MARKER) + "\n")
    return done, half


def _check_continued(out: Path, outcome: Any, half: str, reference: Path) -> None:
    assert not outcome.failed, outcome.failed
    assert (outcome.total, outcome.skipped, outcome.completed) == (RUNS, 1, RUNS - 1)
    expected = _summaries(reference)
    assert len(expected) == RUNS
    assert _summaries(out / "negatives") == expected  # every metric, bit for bit
    # The half-done run resumed from its checkpoint: the first attempt's records are kept.
    assert MARKER in read_jsonl(out / "negatives" / half / "metrics.jsonl")


def test_local_executor_continues_an_interrupted_grid(
        tmp_path: Path, reference: Path) -> None:
    _, half = _interrupted_grid(tmp_path, reference)
    with _one_thread():
        outcome = run_study(SmokeRuns(), tmp_path, progress=False, executor=LocalExecutor(1))
    _check_continued(tmp_path, outcome, half, reference)


@pytest.mark.slow
def test_ray_runs_an_interrupted_grid_to_the_local_summaries(
        tmp_path: Path, reference: Path) -> None:
    pytest.importorskip("ray")
    from crl.experiments.executors.ray import RayExecutor

    _ship_this_module()
    _, half = _interrupted_grid(tmp_path, reference)
    outcome = run_study(SmokeRuns(), tmp_path, progress=False, executor=RayExecutor(num_cpus=2))
    _check_continued(tmp_path, outcome, half, reference)
    import ray

    assert not ray.is_initialized()  # the Ray started for the study is shut down


def _signal_waiting_jobs(study_dir: Path, runs: set[str], stop: threading.Event) -> None:
    """Send each run's waiting first job the time-limit signal (USR2: what Slurm sends
    ``signal_delay_s`` before the limit, and submitit's local executor at its timeout)."""
    pending = set(runs)
    while pending and not stop.wait(0.2):
        for run_id in list(pending):
            waiting = study_dir / run_id / "waiting"
            if waiting.exists() and waiting.read_text():
                os.kill(int(waiting.read_text()), signal.SIGUSR2)
                pending.discard(run_id)


@pytest.mark.slow
def test_submitit_jobs_at_their_time_limit_are_requeued_and_resume_to_the_local_summaries(
        tmp_path: Path, reference: Path) -> None:
    pytest.importorskip("submitit")
    from crl.experiments.executors.submitit import SubmititExecutor

    _ship_this_module()
    done, half = _interrupted_grid(tmp_path, reference)
    study_dir = tmp_path / "negatives"
    executed = {s.run_id for s in SmokeRuns().runs()} - {done}
    stop = threading.Event()
    signaller = threading.Thread(target=_signal_waiting_jobs, args=(study_dir, executed, stop))
    signaller.start()
    try:
        executor = SubmititExecutor(cluster="local", poll_s=0.5)
        outcome = run_study(TimeLimitedRuns(), tmp_path, progress=False, executor=executor)
    finally:
        stop.set()
        signaller.join()
    _check_continued(tmp_path, outcome, half, reference)
    for run_id in executed:
        attempts = read_jsonl(study_dir / run_id / "attempts.jsonl")
        # the first job checkpointed at step HALF; the requeued one resumed from there
        assert [a["resume"] for a in attempts] == [run_id == half, True], run_id
        assert attempts[1]["checkpoint"], run_id
    logs = "".join(p.read_text() for p in (study_dir / "submitit").rglob("*_log.*"))
    assert logs.count("Requeued job") == len(executed)


def _task(device: str = "cpu") -> RunTask:
    spec = RunSpec({"train": {"device": device}}, label="x")
    return RunTask(SmokeRuns(), spec, Path("unused"))


def test_flags_of_another_executor_and_unknown_executors_are_one_line() -> None:
    with pytest.raises(CrlValueError, match=r"unknown --executor 'slurm'.*'submitit'"):
        build_executor("slurm")
    with pytest.raises(CrlValueError, match="--slurm-partition: a setting of --executor "
                                            "submitit, not of --executor ray"):
        build_executor("ray", slurm_partition="gpu")
    with pytest.raises(CrlValueError, match=r"--ray-address.*not of --executor local"):
        build_executor("local", ray_address="auto")
    with pytest.raises(CrlValueError, match="--workers must be an integer >= 1; got 0"):
        build_executor("local", workers=0)
    assert isinstance(build_executor(), Executor)


def test_a_missing_engine_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def without_engines(name: str, *args: Any) -> Any:
        if name in ("ray", "submitit"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_engines)
    for kind, extra in (("ray", "ray"), ("submitit", "slurm")):
        with pytest.raises(CrlValueError) as info:
            require_extra(kind)
        assert str(info.value) == (f"--executor {kind} needs {kind}, which is not installed: "
                                   f'pip install "crl[{extra}]"')


def test_gpus_per_run_need_cuda_runs() -> None:
    with pytest.raises(CrlValueError, match=r"reserves GPUs for runs that train on CUDA "
                                            r"\(--device cuda\), but these runs train on cpu"):
        check_gpus("--gpus-per-run", 1, [_task("cpu")])
    check_gpus("--gpus-per-run", 1, [_task("cuda")])
    check_gpus("--gpus-per-run", 0, [_task("cpu")])


def test_slurm_flags_make_the_job_script(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("submitit")
    from submitit.slurm.slurm import _make_sbatch_string

    from crl.experiments.executors import submitit as executors_submitit

    monkeypatch.setattr(executors_submitit.shutil, "which", lambda name: f"/usr/bin/{name}")
    settings = tmp_path / "slurm.yaml"
    settings.write_text("account: lab\nmem: 16GB\ntime: 30\ncpus_per_task: 2\n")
    executor = build_executor("submitit", workers=4, slurm_partition="gpu",
                              slurm_time="1-00:00:00", slurm_gpus_per_run=1,
                              slurm_setup=["source .venv/bin/activate"],
                              slurm_parameters=settings)
    script = _make_sbatch_string(command="python -m job", folder=tmp_path,
                                 **executor.parameters)  # type: ignore[attr-defined]
    for line in ("#SBATCH --partition=gpu", "#SBATCH --time=1440", "#SBATCH --account=lab",
                 "#SBATCH --gpus-per-node=1", "#SBATCH --cpus-per-task=2", "#SBATCH --mem=16GB",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --signal=USR2@90",
                 "source .venv/bin/activate"):
        assert line in script, line
    assert executor.cpus_per_run == 2  # type: ignore[attr-defined]  # the runs' torch threads
    settings.write_text("partiton: gpu\n")
    with pytest.raises(CrlValueError, match=r"unknown 'partiton'; valid are .*partition"):
        build_executor("submitit", slurm_parameters=settings)
    settings.write_text("- gpu\n")
    with pytest.raises(CrlValueError, match="must hold a mapping"):
        build_executor("submitit", slurm_parameters=settings)
    with pytest.raises(CrlValueError, match="--slurm-time must be minutes"):
        build_executor("submitit", slurm_time="4h")


def test_submitit_without_slurm_says_so() -> None:
    pytest.importorskip("submitit")
    if shutil.which("sbatch") is not None:
        pytest.skip("Slurm is installed here")
    with pytest.raises(CrlValueError, match="sbatch is not on the PATH"):
        build_executor("submitit")


def test_cli_executor_errors_are_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    for args, message in (
            (["--executor", "nope"], "unknown --executor 'nope'"),
            (["--executor", "local", "--slurm-time", "60"], "--slurm-time: a setting of "
             "--executor submitit"),
            (["--executor", "ray", "--ray-address", "auto", "--workers", "2"],
             "--workers sets the CPUs of the local Ray")):
        result = runner.invoke(app, ["study", "gcl", "--preset", "smoke", "--out",
                                     str(tmp_path), *args])
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert result.output.count("\n") == 1
    assert not (tmp_path / "gcl").exists()  # nothing ran


@pytest.mark.parametrize("name", study_names())
def test_every_study_travels_to_the_workers(name: str) -> None:
    """Executors pickle the study whole (the local pool with pickle, submitit and Ray with
    cloudpickle): each registered study must survive the trip with its grid."""
    import pickle

    study = get_study(name, preset="smoke")
    again = pickle.loads(pickle.dumps(study))
    assert [s.run_id for s in again.runs()] == [s.run_id for s in study.runs()]
