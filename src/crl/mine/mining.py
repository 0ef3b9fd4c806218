"""Hard-negative mining with a model: each anchor's best-scoring corpus texts that are not its
positives and pass the range, margin and score filters (docs/data.md, "Mining hard
negatives").

The semantics are those of ``sentence_transformers.util.mine_hard_negatives`` with
``sampling_strategy="top"`` (tested against it on the same model):

- the corpus is the distinct positives (after an optional extra corpus), in first-seen order;
  the queries are the distinct anchors, and a query's positives are the positives of every row
  with that anchor;
- each query keeps its ``range_max + P`` best corpus texts by cosine score (``P``: the most
  positives any query has), blockwise (:func:`crl.mine.search.top_candidates`);
- its positives are dropped; ``margin`` drops a candidate with ``s + margin > p``,
  ``relative_margin`` one with ``s > p - |p| * relative_margin``, where ``p`` is the query's
  lowest positive score; ``max_score`` drops ``s > max_score``, ``min_score`` ``s < min_score``;
- of the candidates left, best first, ranks ``range_min`` to ``range_min + num_negatives - 1``
  are the negatives; a query with fewer left has none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from crl._validation import describe
from crl.errors import CrlValueError
from crl.eval.encoder import TextEncoder, load_encoder
from crl.mine.search import Backend, top_candidates


@dataclass(frozen=True)
class MiningOptions:
    """Which candidates may be negatives (the module docstring; the names of
    ``mine_hard_negatives``, ``margin`` being its ``absolute_margin``).

    Attributes:
        num_negatives: Negatives per anchor (``>= 1``).
        range_min: Best candidates skipped (``>= 0``).
        range_max: Candidates considered (None: ``range_min + num_negatives + P``, or
            ``range_min + 10 num_negatives + P`` with a margin or ``max_score``).
        margin: Absolute margin below the positive's score, or None.
        relative_margin: Margin as a fraction of ``|p|``, or None.
        max_score: Highest score a negative may have, or None.
        min_score: Lowest score a negative may have, or None.
    """

    num_negatives: int = 3
    range_min: int = 0
    range_max: int | None = None
    margin: float | None = None
    relative_margin: float | None = None
    max_score: float | None = None
    min_score: float | None = None

    def __post_init__(self) -> None:
        for name in ("num_negatives", "range_min", "range_max"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise CrlValueError(f"mine: `{name}` must be an integer; got {describe(value)}")
        if self.num_negatives < 1:
            raise CrlValueError(f"mine: `num_negatives` must be >= 1; got {self.num_negatives}")
        if self.range_min < 0:
            raise CrlValueError(f"mine: `range_min` must be >= 0; got {self.range_min}")
        for name in ("margin", "relative_margin", "max_score", "min_score"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise CrlValueError(f"mine: `{name}` must be a finite number or None; got "
                                    f"{describe(value)}")

    def window(self, max_positives: int) -> int:
        """``range_max``, its default resolved and checked for ``max_positives`` (``P``)."""
        filtered = (self.margin is not None or self.relative_margin is not None
                    or self.max_score is not None)
        range_max = self.range_max
        if range_max is None:
            per = 10 if filtered else 1  # room for candidates the filters drop
            range_max = self.range_min + self.num_negatives * per + max_positives
        if self.range_min >= range_max:
            raise CrlValueError(f"mine: `range_min` must be smaller than `range_max`; got "
                                f"range_min={self.range_min}, range_max={range_max}")
        if self.num_negatives > range_max - self.range_min:
            raise CrlValueError(
                f"mine: cannot mine {self.num_negatives} negatives per anchor: only "
                f"{range_max - self.range_min} candidates remain after skipping range_min="
                f"{self.range_min} of range_max={range_max}; lower num_negatives or range_min, "
                "or raise range_max")
        return range_max


@dataclass
class MinedNegatives:
    """What :func:`mine_hard_negatives` found, row by row of its input.

    Attributes:
        negatives: Each row's ``num_negatives`` texts, best first, or None (too few passed).
        scores: ``(R, H)`` float32 their scores (NaN for a row without).
        positive_scores: ``(R,)`` each row's anchor-positive score.
        skipped: Candidates each filter dropped (``margin``, ``relative_margin``,
            ``max_score``, ``min_score``), as ``mine_hard_negatives`` counts them.
        corpus_size: Distinct corpus texts searched.
    """

    negatives: list[list[str] | None]
    scores: Tensor
    positive_scores: Tensor
    skipped: dict[str, int] = field(default_factory=dict)
    corpus_size: int = 0

    @property
    def found(self) -> int:
        """Rows with their negatives."""
        return sum(n is not None for n in self.negatives)


def _drop(scores: Tensor, removed: Tensor, name: str, skipped: dict[str, int]) -> None:
    count = int(removed.sum())
    if count:
        skipped[name] = count
    scores[removed] = -math.inf


def select_negatives(queries: Tensor, corpus: Tensor, positives: Sequence[Sequence[int]],
                     options: MiningOptions, *, backend: Backend = "auto", block: int = 16384
                     ) -> tuple[Tensor, Tensor, dict[str, int]]:
    """Each query's negatives among the corpus rows, on unit-norm embeddings.

    Args:
        queries: ``(Q, D)`` unit-norm query embeddings.
        corpus: ``(N, D)`` unit-norm corpus embeddings.
        positives: Each query's positive corpus rows (at least one each).
        options: The filters.
        backend: The search (:func:`crl.mine.search.top_candidates`).
        block: Its block size.

    Returns:
        ``(indices (Q, H), scores (Q, H), skipped)``: corpus rows best first (``-1`` and
        ``-inf`` where too few candidates passed) and the counts of dropped candidates.
    """
    width = max(len(p) for p in positives)
    range_max = options.window(width)
    cand = top_candidates(queries, corpus, range_max + width, backend=backend, block=block)
    pos = torch.full((len(positives), width), -2, dtype=torch.long)  # (Q, P), -2 pads
    for q, rows in enumerate(positives):
        pos[q, :len(rows)] = torch.as_tensor(list(rows), dtype=torch.long)
    # The lowest positive score of each query: the margins' reference
    pos_emb = corpus[pos.clamp(min=0)]  # (Q, P, D)
    pos_scores = torch.einsum("qd,qpd->qp", queries, pos_emb).masked_fill(pos < 0, math.inf)
    lowest = pos_scores.amin(dim=1, keepdim=True)  # (Q, 1)
    scores = cand.scores.clone()  # (Q, K)
    scores[(cand.indices.unsqueeze(2) == pos.unsqueeze(1)).any(dim=2)] = -math.inf
    skipped: dict[str, int] = {}
    if options.margin is not None:
        _drop(scores, scores + options.margin > lowest, "margin", skipped)
    if options.relative_margin is not None:
        _drop(scores, scores > lowest - lowest.abs() * options.relative_margin,
              "relative_margin", skipped)
    if options.max_score is not None:
        _drop(scores, scores > options.max_score, "max_score", skipped)
    if options.min_score is not None:
        _drop(scores, scores < options.min_score, "min_score", skipped)
    # Dropped candidates sink; the others keep their order (a stable sort of a sorted row).
    scores, order = torch.sort(scores, dim=1, descending=True, stable=True)
    picked = slice(options.range_min, options.range_min + options.num_negatives)
    scores, indices = scores[:, picked], cand.indices.gather(1, order)[:, picked]
    return indices.masked_fill(torch.isinf(scores), -1), scores, skipped


def _embed(encoder: TextEncoder, texts: list[str], queries: bool) -> Tensor:
    out = encoder.encode_queries(texts) if queries else encoder.encode_documents(texts)
    return torch.nn.functional.normalize(out.float(), dim=-1)


def mine_hard_negatives(anchors: Sequence[str], positives: Sequence[str],
                        model: TextEncoder | str | Path, *, corpus: Sequence[str] | None = None,
                        options: MiningOptions | None = None, backend: Backend = "auto",
                        block: int = 16384, device: str = "cpu",
                        batch_size: int = 64) -> MinedNegatives:
    """Hard negatives of each ``(anchor, positive)`` row, mined with ``model``.

    Args:
        anchors: ``R`` anchor texts (queries; repeated anchors share their positives).
        positives: ``R`` positive texts (documents).
        model: A :class:`~crl.eval.encoder.TextEncoder`, or what
            :func:`~crl.eval.encoder.load_encoder` loads (``"minilm"``, a run directory,
            a sentence-transformers or Hugging Face model directory).
        corpus: Further candidate texts (None: the positives only).
        options: The filters (None: :class:`MiningOptions` defaults).
        backend: ``"auto"`` (faiss when installed), ``"torch"`` or ``"faiss"``.
        block: Corpus rows per block of the search.
        device: Where a loaded model runs.
        batch_size: Texts per forward pass of a loaded model.

    Returns:
        :class:`MinedNegatives`, row by row of the input.

    Raises:
        CrlValueError: for no rows, ``anchors`` and ``positives`` of different lengths, or bad
            options.
    """
    options = options or MiningOptions()
    if len(anchors) != len(positives) or not anchors:
        raise CrlValueError(f"mine: `anchors` and `positives` must be non-empty and of the same "
                            f"length; got {len(anchors)} and {len(positives)}")
    encoder = (load_encoder(model, device=device, batch_size=batch_size)
               if isinstance(model, (str, Path)) else model)
    texts = list(dict.fromkeys([*(corpus or []), *positives]))  # distinct, first-seen order
    row_of = {text: i for i, text in enumerate(texts)}
    queries = list(dict.fromkeys(anchors))
    query_of = {text: i for i, text in enumerate(queries)}
    own: list[list[int]] = [[] for _ in queries]
    for a, b in zip(anchors, positives, strict=True):
        if row_of[b] not in own[query_of[a]]:
            own[query_of[a]].append(row_of[b])
    options.window(max(len(p) for p in own))  # bad options fail before the encoding
    zc = _embed(encoder, texts, queries=False)  # (N, D)
    zq = _embed(encoder, queries, queries=True)  # (Q, D)
    indices, scores, skipped = select_negatives(zq, zc, own, options, backend=backend,
                                                block=block)
    q_rows = torch.tensor([query_of[a] for a in anchors])
    p_rows = torch.tensor([row_of[b] for b in positives])
    positive_scores = (zq[q_rows] * zc[p_rows]).sum(dim=1)  # (R,)
    complete = (indices >= 0).all(dim=1)  # (Q,)
    negatives = [[texts[j] for j in indices[q].tolist()] if complete[q] else None
                 for q in q_rows.tolist()]
    row_scores = torch.where(complete[:, None], scores, torch.nan)[q_rows]
    return MinedNegatives(negatives, row_scores, positive_scores, skipped, len(texts))


__all__ = ["MinedNegatives", "MiningOptions", "mine_hard_negatives", "select_negatives"]
