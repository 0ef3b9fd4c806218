"""The token ids of a data set's split kept on disk (``crl.models.tokenizer``): read back equal
to a fresh tokenisation, never trusted when damaged, keyed by the texts and ``max_tokens``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from crl.models import tokenizer as tok
from crl.models.tokenizer import DISK_MIN_TEXTS, MiniLMTokenizer

TEXTS = [f"def f{i}(x): return x + {i}  # adds {i}" for i in range(DISK_MIN_TEXTS + 7)]


@pytest.fixture(autouse=True)
def _fresh_memos(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tok, "_MEMOS", {})  # each test starts as a new process would


def _no_encoding(self: MiniLMTokenizer, texts: list[str]) -> torch.Tensor:
    raise AssertionError("tokenised again: the file was not read")


def test_a_split_is_tokenised_once_and_read_back_equal(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = MiniLMTokenizer(16, disk=False)(TEXTS)
    first = MiniLMTokenizer(16, cache_dir=tmp_path)(TEXTS)
    [path] = (tmp_path / "tokens").iterdir()
    assert torch.equal(first, fresh) and first.dtype == torch.long
    monkeypatch.setattr(tok, "_MEMOS", {})
    monkeypatch.setattr(MiniLMTokenizer, "_encode", _no_encoding)
    again = MiniLMTokenizer(16, cache_dir=tmp_path)(TEXTS)
    assert torch.equal(again, fresh)
    assert path.name.startswith("minilm-16-") and list((tmp_path / "tokens").iterdir()) == [path]


def test_the_key_is_the_texts_their_order_and_max_tokens(tmp_path: Path) -> None:
    tokenizer = MiniLMTokenizer(16, cache_dir=tmp_path)
    names = {tokenizer.disk_path(TEXTS), tokenizer.disk_path(TEXTS[::-1]),
             tokenizer.disk_path([*TEXTS[:-1], TEXTS[-1] + " "]),
             MiniLMTokenizer(32, cache_dir=tmp_path).disk_path(TEXTS)}
    assert len(names) == 4
    # texts that join to the same string are still different lists
    assert tokenizer.disk_path(["ab", "c"] * 200) != tokenizer.disk_path(["a", "bc"] * 200)


@pytest.mark.parametrize("damage", ["garbage", "shape", "dtype", "range", "pickle"])
def test_a_damaged_file_is_ignored_and_written_again(tmp_path: Path, damage: str) -> None:
    tokenizer = MiniLMTokenizer(16, cache_dir=tmp_path)
    want = MiniLMTokenizer(16, disk=False)(TEXTS)
    path = tokenizer.disk_path(TEXTS)
    path.parent.mkdir(parents=True)
    n = len(TEXTS)
    if damage == "garbage":
        path.write_bytes(b"\x93NUMPY not really")
    elif damage == "shape":
        np.save(path, np.zeros((n, 8), dtype=np.int32))
    elif damage == "dtype":
        np.save(path, np.zeros((n, 16), dtype=np.float32))
    elif damage == "range":
        np.save(path, np.full((n, 16), 10**6, dtype=np.int32))
    else:  # an object array would need pickle: never loaded
        np.save(path, np.array([{"x": 1}] * n, dtype=object), allow_pickle=True)
    assert torch.equal(tokenizer(TEXTS), want)
    assert np.array_equal(np.load(path, allow_pickle=False), want.numpy())  # rewritten


def test_short_lists_and_disk_false_stay_in_memory(tmp_path: Path) -> None:
    MiniLMTokenizer(16, cache_dir=tmp_path)(TEXTS[: DISK_MIN_TEXTS - 1])
    MiniLMTokenizer(16, cache_dir=tmp_path / "off", disk=False)(TEXTS)
    assert not (tmp_path / "tokens").exists() and not (tmp_path / "off").exists()
