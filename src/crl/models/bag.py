"""A text tower trained from scratch: a bag of MiniLM word pieces (and hashed bigrams).

The token ids come from :class:`crl.models.tokenizer.MiniLMTokenizer`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from crl.models.bag_rows import BagRows, bag_rows, gathered_mean

# A large odd multiplier that spreads (first, second) token pairs over the bigram buckets.
_BIGRAM_MULTIPLIER = 1_000_003


class EmbeddingBagEncoder(nn.Module):
    """Mean of learned embeddings of the token ids (and hashed token bigrams) of each text.

    Pad ids are left out of the mean; a text with no tokens maps to zeros.

    Args:
        vocab_size: Number of token ids.
        dim: Embedding width (the output dimension).
        bigram_buckets: If > 0, each pair of adjacent tokens ``(s, t)`` also contributes the
            embedding of bucket ``(s * 1000003 + t) mod bigram_buckets``.
        pad_id: The padding id.
        sparse: Sparse gradients for the table (only the rows a batch uses, computed by
            :mod:`crl.models.bag_rows`; trained with :class:`crl.train.lazy_adamw.LazyAdamW`,
            docs/training.md, section "Sparse embedding gradients"). The table stays in
            ``bag.weight`` either way.

    Example:
        >>> enc = EmbeddingBagEncoder(100, 8, bigram_buckets=16)
        >>> enc(torch.tensor([[5, 7, 0, 0], [5, 7, 9, 0]])).shape
        torch.Size([2, 8])
    """

    def __init__(self, vocab_size: int, dim: int, bigram_buckets: int = 0,
                 pad_id: int = 0, sparse: bool = False) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.bigram_buckets = bigram_buckets
        self.pad_id = pad_id
        self.sparse = sparse
        self.bag = nn.EmbeddingBag(vocab_size + bigram_buckets, dim, mode="mean",
                                   padding_idx=pad_id, sparse=sparse)
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

    def rows(self, ids: Tensor) -> Tensor | BagRows:
        """What :meth:`pool` averages for token ids ``(B, L)``: the bag ids, or (sparse) their
        :class:`~crl.models.bag_rows.BagRows`; the same for every encoder of a group's runs."""
        ids = self.bag_ids(ids)
        return bag_rows(ids, self.pad_id) if self.sparse else ids

    def pool(self, rows: Tensor | BagRows) -> Tensor:
        """The bags ``(B, dim)`` of :meth:`rows`' result, from this encoder's table."""
        if isinstance(rows, BagRows):
            return gathered_mean(self.bag.weight, rows)
        out: Tensor = self.bag(rows)
        return out

    def forward(self, ids: Tensor) -> Tensor:
        """The bags ``(B, dim)`` of token ids ``(B, L)``."""
        return self.pool(self.rows(ids))
