"""Checkpoints refuse what they cannot trust and change nothing when they do; a non-finite
training loss stops the run with the step and the last good checkpoint, never NaN weights."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from crl import __version__
from crl.cli import app
from crl.errors import CrlError
from crl.rundir import read_json, read_jsonl
from crl.train import NonFiniteLossError, TrainConfig, config_hash, fit, load_config
from crl.train.checkpoint import load_checkpoint

# 64 pairs, batches of 16 (4 steps an epoch), 8 steps, a checkpoint every 2.
TINY = ["data.num_train=64", "data.synthetic.num_samples=128", "train.batch_size=16",
        "train.steps=8", "train.checkpoint_every=2", "train.log_every=1", "train.num_threads=1",
        "eval.ks=[1]", "eval.probe=false"]


def _config(*extra: str) -> TrainConfig:
    return load_config("synthetic-gaussian", [*TINY, *extra])


def _hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped at step 4 (checkpoint at step 4), shared read-only by the tests."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    fit(_config(), run, progress=False, stop_at=4)
    return run


def _copy(run: Path, to: Path) -> Path:
    to.mkdir(parents=True)
    for path in run.iterdir():
        (to / path.name).write_bytes(path.read_bytes())
    return to


def _refused(run: Path, config: TrainConfig, match: str) -> None:
    before = _hashes(run)
    with pytest.raises(CrlError, match=match) as info:
        fit(config, run, progress=False, resume=True)
    assert len(str(info.value).splitlines()) == 1
    assert _hashes(run) == before, "a refused resume changed the run directory"


@pytest.mark.parametrize("override", ["optim.lr=0.5", "train.steps=9", "loss.temperature=0.5",
                                      "train.seed=1"])
def test_resume_with_another_config_is_refused(stopped: Path, tmp_path: Path,
                                               override: str) -> None:
    run = _copy(stopped, tmp_path / "run")
    other = _config(override)
    _refused(run, other, rf"belongs to config {config_hash(_config())}, not to the given "
                         rf"config {config_hash(other)}")


@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 0.9, 0.999])
def test_truncated_checkpoint_is_refused(stopped: Path, tmp_path: Path, keep: float) -> None:
    run = _copy(stopped, tmp_path / "run")
    data = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(data[: int(len(data) * keep)])
    _refused(run, _config(), "truncated or corrupt")


def _entries(path: Path) -> list[tuple[str, int, int]]:
    """``(name, data offset, size)`` of every stored entry of a checkpoint's zip archive."""
    out = []
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.file_size == 0:
                continue
            with archive.open(info) as handle:
                handle.read(1)
            # The entry's data starts after its local header (30 bytes, name, extra field).
            raw = path.read_bytes()[info.header_offset:info.header_offset + 30]
            name_len = int.from_bytes(raw[26:28], "little")
            extra_len = int.from_bytes(raw[28:30], "little")
            out.append((info.filename, info.header_offset + 30 + name_len + extra_len,
                        info.compress_size))
    return out


def test_flipped_bytes_in_any_entry_are_refused(stopped: Path, tmp_path: Path) -> None:
    """torch.load alone would load flipped weight bytes silently; the CRC check refuses them."""
    entries = _entries(stopped / "checkpoint.pt")
    weights = [e for e in entries if "/data/" in e[0]]
    assert weights and any(e[0].endswith("data.pkl") for e in entries)
    original = (stopped / "checkpoint.pt").read_bytes()
    for number, (_name, offset, size) in enumerate(entries):
        run = _copy(stopped, tmp_path / f"run{number}")
        damaged = bytearray(original)
        damaged[offset + size // 2] ^= 0x01  # one bit
        (run / "checkpoint.pt").write_bytes(bytes(damaged))
        _refused(run, _config(), "truncated or corrupt")
    # The same bit flip in a weight is invisible to torch.load: the check is needed.
    _, offset, size = weights[0]
    damaged = bytearray(original)
    damaged[offset + size // 2] ^= 0x01
    torch.load(io.BytesIO(bytes(damaged)), weights_only=False)


def test_garbage_and_foreign_files_are_refused(stopped: Path, tmp_path: Path) -> None:
    run = _copy(stopped, tmp_path / "garbage")
    (run / "checkpoint.pt").write_bytes(np.random.default_rng(0).bytes(5000))
    _refused(run, _config(), "truncated or corrupt")
    run = _copy(stopped, tmp_path / "foreign")
    torch.save({"weights": torch.ones(3)}, run / "checkpoint.pt")
    _refused(run, _config(), "is not a crl checkpoint")


def test_checkpoint_records_config_hash_and_version(stopped: Path) -> None:
    state = load_checkpoint(stopped / "checkpoint.pt", config_hash=config_hash(_config()))
    assert state["config_hash"] == config_hash(_config()) == read_json(
        stopped / "config.json")["run_id"]
    assert state["crl_version"] == __version__ and state["step"] == 4


def test_version_mismatch_changes_nothing(stopped: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    run = _copy(stopped, tmp_path / "run")
    monkeypatch.setattr("crl.train.checkpoint.__version__", "0.0.0-other")
    _refused(run, _config(), "was written by crl")


# ----------------------------------------------------------------------------- non-finite


def test_huge_learning_rate_stops_with_step_and_last_checkpoint(tmp_path: Path) -> None:
    """A real divergence (lr 1e30, no mocking) through the command line."""
    args = ["train", "synthetic-gaussian", "--out", str(tmp_path), "--no-progress"]
    for item in [*TINY, "optim.lr=1e30", "train.checkpoint_every=1"]:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith("error: the training loss is nan at step 2; stopped without saving")
    cfg = load_config("synthetic-gaussian", [*TINY, "optim.lr=1e30", "train.checkpoint_every=1"])
    run = tmp_path / f"synthetic-gaussian-{config_hash(cfg)}"
    assert f"the last good checkpoint is {run / 'checkpoint.pt'} at step 1" in line
    state = load_checkpoint(run / "checkpoint.pt", config_hash=config_hash(cfg))
    assert state["step"] == 1
    tensors = [*state["model"].values(), *state["objective"].values()]
    assert all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())
    assert not (run / "summary.json").exists()
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1]
    assert all(isinstance(v, (int, float)) for v in records[0].values())


def test_huge_data_values_stop_at_the_first_step(tmp_path: Path) -> None:
    """Finite inputs that overflow float32 in the scores: stopped before any weight update."""
    rng = np.random.default_rng(0)
    path = tmp_path / "pairs.npz"
    np.savez(path, a=rng.normal(size=(128, 2)) * 1e30, b=rng.normal(size=(128, 2)) * 1e30)
    cfg = load_config("synthetic-gaussian", [*TINY, "data.name=files",
                                             f"data.files.path={path}"])
    with pytest.raises(NonFiniteLossError, match=r"at step 1; stopped without saving the "
                                                 r"weights; no checkpoint was written yet"):
        fit(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
    assert not (tmp_path / "run" / "summary.json").exists()


def test_full_disk_during_a_checkpoint_keeps_the_old_one(stopped: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC in the middle of writing checkpoint.pt: one line naming the file and the reason,
    the previous checkpoint intact, no temporary file left."""
    import errno

    import crl.rundir as rundir

    cfg = _config()
    out = tmp_path / "runs"
    run = _copy(stopped, out / f"synthetic-gaussian-{config_hash(cfg)}")
    before = (run / "checkpoint.pt").read_bytes()
    real = rundir.atomic_write

    def full_disk(path: str | Path, write: object) -> None:
        def partial(handle: io.BufferedWriter) -> None:
            handle.write(b"PK\x03\x04 half a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, partial if Path(path).name == "checkpoint.pt" else write)  # type: ignore[arg-type]

    monkeypatch.setattr("crl.train.checkpoint.atomic_write", full_disk)
    args = ["train", "synthetic-gaussian", "--out", str(out), "--no-progress", "--resume"]
    for item in TINY:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert line == (f"error: cannot use {run / 'checkpoint.pt'}: No space left on device; "
                    "check the path, its permissions and the free disk space")
    assert (run / "checkpoint.pt").read_bytes() == before
    assert not list(run.glob(".*.tmp"))
    assert load_checkpoint(run / "checkpoint.pt")["step"] == 4
