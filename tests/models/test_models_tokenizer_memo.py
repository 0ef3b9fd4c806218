"""The tokenizer's in-process memo: each text tokenised once, the same ids as tokenising now."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

import crl.models.tokenizer as tokenizer_module
from crl.models.text import minilm_model_dir
from crl.models.tokenizer import MiniLMTokenizer

TEXTS = ["Return the sum of x and y.", "def add(x, y):\n    return x + y", "",
         "A much longer docstring " * 40, "Ünïcode ✓ text", "def f(): pass"]


def _direct(texts: list[str], max_tokens: int) -> torch.Tensor:
    """The ids the tokenizers library gives for ``texts`` in one batch, no memo."""
    tok = Tokenizer.from_file(str(minilm_model_dir() / "tokenizer.json"))
    tok.enable_truncation(max_length=max_tokens)
    tok.enable_padding(length=max_tokens, pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    return torch.tensor([e.ids for e in tok.encode_batch(texts, add_special_tokens=False)],
                        dtype=torch.long)


@pytest.fixture(autouse=True)
def _fresh_memos(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenizer_module, "_MEMOS", {})


def _counting(tok: MiniLMTokenizer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    counts: list[int] = []
    encode = tok._encode

    def counted(texts: list[str]) -> torch.Tensor:
        counts.append(len(texts))
        return encode(texts)

    monkeypatch.setattr(tok, "_encode", counted)
    return counts


def test_memo_hits_equal_tokenising_now(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = MiniLMTokenizer(max_tokens=12)
    counts = _counting(tok, monkeypatch)
    first = tok(TEXTS[:4])
    assert counts == [4]
    again = tok([TEXTS[3], TEXTS[0], TEXTS[5], TEXTS[0], TEXTS[4]])  # repeats, order, new ones
    assert counts == [4, 2]  # only the two new texts were tokenised
    assert torch.equal(first, _direct(TEXTS[:4], 12))
    assert torch.equal(again, _direct([TEXTS[3], TEXTS[0], TEXTS[5], TEXTS[0], TEXTS[4]], 12))
    assert again.dtype == torch.long
    assert torch.equal(tok(TEXTS), _direct(TEXTS, 12))
    assert counts == [4, 2]
    assert tok([]).shape == (0, 12)


def test_memos_are_per_max_tokens() -> None:
    short, long = MiniLMTokenizer(max_tokens=4), MiniLMTokenizer(max_tokens=20)
    assert torch.equal(short(TEXTS), _direct(TEXTS, 4))
    assert torch.equal(long(TEXTS), _direct(TEXTS, 20))
    assert torch.equal(MiniLMTokenizer(max_tokens=4)(TEXTS[::-1]), _direct(TEXTS[::-1], 4))


def test_a_full_memo_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenizer_module, "MEMO_MAX_IDS", 3 * 8)  # three texts of 8 ids
    tok = MiniLMTokenizer(max_tokens=8)
    counts = _counting(tok, monkeypatch)
    assert torch.equal(tok(TEXTS[:2]), _direct(TEXTS[:2], 8))
    assert torch.equal(tok(TEXTS[2:4]), _direct(TEXTS[2:4], 8))  # would make four: restart
    assert counts == [2, 2]
    assert torch.equal(tok(TEXTS[:4]), _direct(TEXTS[:4], 8))
    assert counts == [2, 2, 4]
    assert len(tok._memo.index) == 4  # one call larger than the memo is kept until the next
