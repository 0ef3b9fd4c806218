"""Nothing in a run directory is code, nothing is written outside ``--out``, one writer per
directory, and a failed write leaves no temporary file (issue 27, rows 1-4 and 12).

The payload tests go through the real command line: ``python -m crl ...`` in a subprocess whose
working directory holds the hostile module (``python -m`` puts it first on ``sys.path``, so an
import of the module would succeed), and check that the marker file the payload would create
does not appear. Each payload is shown to be live first (it does create the marker when it is
trusted), so the tests can fail.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from test_robustness_checkpoint_code import _CreatesFile, _hostile_checkpoint
from typer.testing import CliRunner

from crl.cli import app
from crl.errors import CrlError
from crl.rundir import LOCK_FILE, lock_directory, read_jsonl
from crl.train import config_hash, fit, load_config, validate_config

TINY = ["data.num_train=64", "data.synthetic.num_samples=128", "train.batch_size=16",
        "train.steps=4", "train.checkpoint_every=2", "train.log_every=1", "train.num_threads=1",
        "eval.ks=[1]", "eval.probe=false"]
TINY_ARGS = [a for o in TINY for a in ("--set", o)]
# A study of two runs (shared and independent negatives at one n, m and seed).
# --keep-weights: the finished runs keep their checkpoint.pt, which the fuzz damages too.
STUDY = ["study", "negatives", "--preset", "smoke", "--data", "synthetic", "--ns", "64",
         "--fractions", "0.5", "--seeds", "0", "--refine-runs", "0", "--workers", "1",
         "--no-progress", "--keep-weights"]
MARKER = "MARKER"

# Imported, it creates MARKER beside itself; its factory builds crl's own linear towers, so a
# run that trusts it loads the checkpoint of a linear run and evaluates like it.
EVIL_MODULE = '''
from pathlib import Path

Path(__file__).with_name("MARKER").write_text("the module ran")

from torch import nn

from crl.models.towers import Tower


def build(cfg, info):
    def tower(dim):
        return Tower(nn.Sequential(nn.Flatten(), nn.Linear(dim, cfg.resolved_embed_dim())))
    return tower(info.dim_a), tower(info.dim_b)
'''


def _crl(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CRL_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-m", "crl", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def _tree(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``folder`` (links and folders by kind)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        key = path.relative_to(folder).as_posix()
        out[key] = ("link" if path.is_symlink() else "dir" if path.is_dir()
                    else hashlib.sha256(path.read_bytes()).hexdigest())
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny ``synthetic-gaussian`` run (linear towers)."""
    config = load_config("synthetic-gaussian", [*TINY, "model.kind=linear"])
    run = tmp_path_factory.mktemp("trained") / f"synthetic-gaussian-{config_hash(config)}"
    fit(config, run, progress=False)
    return run


def _plant_factory(trained: Path, tmp: Path, factory: str) -> Path:
    """A copy of ``trained`` whose config.json says ``model.kind: custom, factory: FACTORY``,
    with its checkpoint's config hash patched to match (as an attacker would), and the hostile
    module in ``tmp``."""
    run = tmp / "sent" / trained.name
    shutil.copytree(trained, run)
    stored = json.loads((run / "config.json").read_text())
    stored["config"]["model"].update(kind="custom", factory=factory)
    (run / "config.json").write_text(json.dumps(stored))
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    state["config_hash"] = config_hash(validate_config(stored["config"], origin="test"))
    torch.save(state, run / "checkpoint.pt")
    (tmp / "evilmod.py").write_text(EVIL_MODULE)
    return run


# ----------------------------------------------------------------------------- row 1: no code


def test_a_planted_factory_runs_only_when_the_user_names_it(trained: Path, tmp_path: Path) -> None:
    run = _plant_factory(trained, tmp_path, "evilmod:build")
    result = _crl(["eval", str(run), "--trust-factory", "evilmod:build"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / MARKER).exists(), "the payload is not live, the tests below prove nothing"


@pytest.mark.parametrize(("command", "factory", "trust"), [
    ("eval", "evilmod:build", None),
    ("encode", "evilmod:build", None),
    ("export", "evilmod:build", None),
    ("eval", "evilmod:build", "evilmod:other"),  # trusting another factory trusts not this one
    ("eval", "this:x", None),  # a module of the standard library is imported no more
])
def test_a_factory_in_a_run_directory_is_refused_and_not_imported(
        trained: Path, tmp_path: Path, command: str, factory: str, trust: str | None) -> None:
    run = _plant_factory(trained, tmp_path, factory)
    (tmp_path / "texts.jsonl").write_text('{"a": "x", "b": "y"}\n')
    args = {"eval": ["eval", str(run)],
            "encode": ["encode", str(run), str(tmp_path / "texts.jsonl"), "--out",
                       str(tmp_path / "e.npy")],
            "export": ["export", str(run), str(tmp_path / "exported")]}[command]
    before = _tree(run)
    result = _crl([*args, *(["--trust-factory", trust] if trust else [])], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    line = _one_line(result.stderr)
    assert f"names code to run (model.factory {factory!r})" in line
    assert f"pass --trust-factory {factory}" in line
    assert not (tmp_path / MARKER).exists(), "the run directory's factory was imported"
    assert "The Zen of Python" not in result.stdout  # what importing `this` prints
    assert _tree(run) == before and not (tmp_path / "e.npy").exists()
    assert not (tmp_path / "exported").exists()


def test_a_pickle_in_checkpoint_pt_runs_nothing(trained: Path, tmp_path: Path) -> None:
    run = tmp_path / trained.name
    shutil.copytree(trained, run)
    _hostile_checkpoint(run / "checkpoint.pt", tmp_path / MARKER)
    result = _crl(["eval", str(run)], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "holds objects other than tensors and plain values" in _one_line(result.stderr)
    assert not (tmp_path / MARKER).exists()
    torch.load(run / "checkpoint.pt", weights_only=False)  # the payload is live
    assert (tmp_path / MARKER).exists()


def test_a_pickle_in_pretrained_weights_runs_nothing(tiny_bert: Path, tmp_path: Path) -> None:
    pretrained = tmp_path / "downloaded-model"
    shutil.copytree(tiny_bert, pretrained)
    (pretrained / "model.safetensors").unlink()  # transformers then reads pytorch_model.bin
    torch.save({"embeddings.word_embeddings.weight": _CreatesFile(tmp_path / MARKER)},
               pretrained / "pytorch_model.bin")
    with (tmp_path / "pairs.jsonl").open("w") as handle:
        for i in range(16):
            handle.write(json.dumps({"a": f"add {i}", "b": f"def add {i}"}) + "\n")
    config = {"data": {"name": "files", "files": {"path": str(tmp_path / "pairs.jsonl")}},
              "model": {"kind": "transformer", "pretrained": str(pretrained)},
              "train": {"batch_size": 4, "steps": 1}, "eval": {"probe": False, "ks": [1]}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    result = _crl(["train", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "runs"),
                   "--no-progress"], cwd=tmp_path)
    assert result.returncode != 0, result.stderr
    assert not (tmp_path / MARKER).exists(), "loading the pretrained weights ran their pickle"
    torch.load(pretrained / "pytorch_model.bin", weights_only=False)  # the payload is live
    assert (tmp_path / MARKER).exists()


@pytest.mark.parametrize("where", ["file", "--set"])
def test_a_python_yaml_tag_runs_nothing(tmp_path: Path, where: str) -> None:
    tag = f'!!python/object/apply:builtins.open ["{tmp_path / MARKER}", "w"]'
    if where == "file":
        (tmp_path / "evil.yaml").write_text(f"data:\n  name: synthetic\ntrain:\n  steps: {tag}\n")
        args = ["train", str(tmp_path / "evil.yaml")]
    else:
        args = ["train", "synthetic-gaussian", "--set", f"train.steps={tag}"]
    result = _crl([*args, "--out", str(tmp_path / "runs"), "--no-progress"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    _one_line(result.stderr)
    assert not (tmp_path / MARKER).exists()
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- studies


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``--out`` of a finished two-run study (:data:`STUDY`)."""
    out = tmp_path_factory.mktemp("study")
    result = CliRunner().invoke(app, [*STUDY, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _copy_study(study: Path, tmp: Path) -> tuple[Path, Path]:
    out = tmp / "out"
    shutil.copytree(study, out)
    return out, out / "negatives"


def _a_run(study_dir: Path) -> Path:
    return sorted(p.parent for p in study_dir.glob("*/summary.json"))[0]


def test_a_study_never_imports_a_factory_from_its_run_directories(
        study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, study_dir = _copy_study(study, tmp_path)
    run = _a_run(study_dir)
    for name in ("spec.json", "config.json"):
        stored = json.loads((run / name).read_text())
        stored["config"]["model"].update(kind="custom", factory="evilmod:build")
        (run / name).write_text(json.dumps(stored))
    (run / "summary.json").unlink()  # so the re-run trains this run again
    (tmp_path / "evilmod.py").write_text(EVIL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(app, [*STUDY, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / MARKER).exists()
    assert (run / "summary.json").exists()


# ----------------------------------------------------------------------------- row 2: links


def test_a_study_run_directory_linked_elsewhere_is_refused(study: Path, tmp_path: Path) -> None:
    out, study_dir = _copy_study(study, tmp_path)
    run = _a_run(study_dir)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(run, elsewhere)
    (elsewhere / "summary.json").unlink()  # unfinished: a re-run would write its files
    shutil.rmtree(run)
    run.symlink_to(elsewhere, target_is_directory=True)
    before, study_before = _tree(elsewhere), _tree(study_dir)
    result = CliRunner().invoke(app, [*STUDY, "--out", str(out)])
    assert result.exit_code == 2, result.output
    line = _one_line(result.stderr)
    assert f"{run} is a symbolic link" in line and "never writes through a link" in line
    assert _tree(elsewhere) == before, "the study wrote outside its directory"
    assert _tree(study_dir) == study_before


def test_crl_train_into_a_linked_run_directory_or_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    run = out / f"synthetic-gaussian-{config_hash(load_config('synthetic-gaussian', TINY))}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("keep me")
    out.mkdir()
    run.symlink_to(elsewhere, target_is_directory=True)
    args = ["train", "synthetic-gaussian", *TINY_ARGS, "--out", str(out), "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"{run} is a symbolic link" in _one_line(result.stderr)
    assert _tree(elsewhere) == {"notes.txt": hashlib.sha256(b"keep me").hexdigest()}
    # A dangling link where metrics.jsonl goes: it is not followed to create the file.
    run.unlink()
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(elsewhere / "metrics.jsonl")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"{run / 'metrics.jsonl'} is a symbolic link" in _one_line(result.stderr)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["notes.txt"]


# ----------------------------------------------------------------------------- row 3, 4: locks


@contextlib.contextmanager
def _locked_elsewhere(folder: Path) -> Iterator[int]:
    """Another process holds ``folder``'s write lock for the block; yields its pid."""
    code = ("import sys, time; from crl.rundir import lock_directory\n"
            "with lock_directory(sys.argv[1], blocking=False):\n"
            "    print('locked', flush=True); time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], text=True,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_a_second_writer_of_a_locked_run_directory_fails_at_once_naming_the_holder(
        trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    run = out / trained.name
    shutil.copytree(trained, run)
    with _locked_elsewhere(run) as holder:
        before = _tree(run)
        started = time.monotonic()
        result = CliRunner().invoke(app, ["train", "synthetic-gaussian", *TINY_ARGS,
                                          "--set", "model.kind=linear", "--out", str(out),
                                          "--resume", "--no-progress"])
        assert time.monotonic() - started < 60  # it did not wait for the holder
        assert _tree(run) == before
    assert result.exit_code == 2, result.output
    line = _one_line(result.stderr)
    assert f"{run} is being written by another crl process (pid {holder})" in line


def test_two_crl_train_into_one_out_at_once(tmp_path: Path) -> None:
    args = ["train", "synthetic-gaussian", "--set", "train.steps=300", "--set",
            "train.log_every=1", "--set", "train.num_threads=1", "--set", "eval.probe=false",
            "--out", str(tmp_path / "runs"), "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "CRL_DEBUG"}
    procs = [subprocess.Popen([sys.executable, "-m", "crl", *args], cwd=tmp_path, env=env,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    results = [(p.pid, *p.communicate(timeout=600), p.returncode) for p in procs]
    codes = sorted(r[3] for r in results)
    assert codes == [0, 2], results
    (winner,) = [r for r in results if r[3] == 0]
    (loser,) = [r for r in results if r[3] == 2]
    line = _one_line(loser[2])
    # The second to start found the lock held (or, had the first already finished, the run).
    assert (f"is being written by another crl process (pid {winner[0]})" in line
            or "already holds" in line), line
    (run,) = (tmp_path / "runs").iterdir()
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 300
    assert not (run / LOCK_FILE).exists()


@pytest.mark.parametrize("written_after", [0.05, None])
def test_a_lock_taken_a_moment_ago_names_its_holder(
        written_after: float | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder writes its pid just after taking the lock: a refusal in between waits for the
    pid (so the message names it) and, if none ever comes, calls the holder unknown."""
    import fcntl
    import threading

    import crl.rundir.lock as lock_module

    monkeypatch.setattr(lock_module, "_HOLDER_WAIT", 0.5)
    run = tmp_path / "run"
    run.mkdir()
    fd = os.open(run / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held, still empty
    timer = None
    if written_after is not None:
        timer = threading.Timer(written_after, lambda: os.pwrite(fd, b"424242\n", 0))
        timer.start()
    try:
        with pytest.raises(CrlError, match=r"another crl process \(pid (\S+)\)") as caught:
            with lock_directory(run, blocking=False):
                pass
    finally:
        if timer is not None:
            timer.join()
        os.close(fd)
    want = "424242" if written_after is not None else "unknown"
    assert f"(pid {want})" in str(caught.value)


def test_a_study_into_a_locked_study_directory_fails_at_once(study: Path, tmp_path: Path) -> None:
    out, study_dir = _copy_study(study, tmp_path)
    with _locked_elsewhere(study_dir) as holder:
        before = _tree(study_dir)
        result = CliRunner().invoke(app, [*STUDY, "--out", str(out)])
        assert _tree(study_dir) == before
    assert result.exit_code == 2, result.output
    line = _one_line(result.stderr)
    assert f"{study_dir} is being written by another crl process (pid {holder})" in line


def test_a_study_with_other_options_is_refused_without_force(study: Path, tmp_path: Path) -> None:
    out, study_dir = _copy_study(study, tmp_path)
    before = _tree(study_dir)
    result = CliRunner().invoke(app, [*STUDY, "--tolerance", "0.02", "--out", str(out)])
    assert result.exit_code == 2, result.output
    line = _one_line(result.stderr)
    assert "holds a study with other options" in line and "tolerance" in line
    assert "--force" in line
    assert _tree(study_dir) == before
    result = CliRunner().invoke(app, [*STUDY, "--tolerance", "0.02", "--force", "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((study_dir / "study.json").read_text())["options"]["tolerance"] == 0.02


def test_the_directory_lock_is_reentrant_in_a_thread_and_exclusive_across_processes(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    with lock_directory(run, blocking=False):
        with lock_directory(run, blocking=True):  # the executor's, then fit's: no deadlock
            assert (run / LOCK_FILE).read_text().strip() == str(os.getpid())
        code = ("import sys; from crl.rundir import lock_directory\n"
                "with lock_directory(sys.argv[1], blocking=False): pass\n")
        other = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True,
                               text=True, check=False)
        assert other.returncode != 0
        assert f"another crl process (pid {os.getpid()})" in other.stderr
    assert not run.exists()  # made for the lock, nothing written: removed with it


# ----------------------------------------------------------------------------- row 12: temporaries


@pytest.fixture(scope="module")
def text_run(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(run, pairs.jsonl)``: a finished run fine-tuning the tiny BERT on 16 pairs."""
    folder = tmp_path_factory.mktemp("text-run")
    data = folder / "pairs.jsonl"
    data.write_text("".join(json.dumps({"a": f"add {i}", "b": f"def add {i}"}) + "\n"
                            for i in range(16)))
    config = {"data": {"name": "files", "files": {"path": str(data)}},
              "model": {"kind": "transformer", "pretrained": str(tiny_bert),
                        "max_seq_length": 16},
              "train": {"batch_size": 8, "steps": 1, "num_threads": 1},
              "eval": {"probe": False, "ks": [1]}}
    (folder / "run.yaml").write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(app, ["train", str(folder / "run.yaml"), "--out",
                                      str(folder / "runs"), "--no-progress"])
    assert result.exit_code == 0, result.output
    (run,) = (folder / "runs").iterdir()
    return run, data


def _temporaries(*folders: Path) -> list[str]:
    return [p.name for folder in folders for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_encode_into_an_existing_directory_names_it_and_leaves_nothing(
        text_run: tuple[Path, Path], tmp_path: Path) -> None:
    run, data = text_run
    existing = tmp_path / "embeddings"
    existing.mkdir()
    result = CliRunner().invoke(app, ["encode", str(run), str(data), "--out", str(existing),
                                      "--no-progress"])
    assert result.exit_code == 2, result.output
    line = _one_line(result.stderr)
    assert f"--out {existing} is a directory" in line and ".tmp" not in line
    assert _temporaries(existing, tmp_path) == [] and not any(existing.iterdir())


def test_a_failed_encode_write_names_the_file_and_leaves_no_temporary(
        text_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    run, data = text_run
    real_save = np.save

    def full_disk(file: Any, array: Any, *args: Any, **kwargs: Any) -> None:
        real_save(file, array[:1])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full_disk)
    out = tmp_path / "e.npy"
    result = CliRunner().invoke(app, ["encode", str(run), str(data), "--out", str(out),
                                      "--no-progress"])
    assert result.exit_code == 2, result.output
    assert _one_line(result.stderr) == (f"error: cannot use {out}: No space left on device; "
                                        "check the path, its permissions and the free disk space")
    assert not out.exists() and _temporaries(tmp_path) == []


def test_a_failed_export_names_the_directory_and_leaves_no_staging(
        text_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from sentence_transformers import SentenceTransformer

    run, _ = text_run

    def full_disk(self: Any, path: str, *args: Any, **kwargs: Any) -> None:
        (Path(path) / "config.json").write_text("{}")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SentenceTransformer, "save", full_disk)
    out = tmp_path / "exported"
    result = CliRunner().invoke(app, ["export", str(run), str(out)])
    assert result.exit_code == 2, result.output
    assert _one_line(result.stderr) == (f"error: cannot use {out}: No space left on device; "
                                        "check the path, its permissions and the free disk space")
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# ----------------------------------------------------------------------------- the audit table


def test_the_audit_table_names_tests_that_exist() -> None:
    """Every test docs/errors.md's "Files run no code" table cites is defined here or in the
    file it names, and every payload test here is cited."""
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    section = doc[doc.index("## Files run no code"):]
    section = section[:section.index("\n## ", 1)]
    cited = set(re.findall(r"`(test_\w+)`", section))
    here = {name for name in globals() if name.startswith("test_")}
    assert cited <= here, cited - here
    payloads = {name for name in here if "runs_nothing" in name or "factory" in name}
    assert payloads <= cited, payloads - cited
