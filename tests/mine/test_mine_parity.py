"""crl's mining against sentence-transformers' own ``mine_hard_negatives`` on the same model
and data: the same negatives for every (anchor, positive) row, the same rows without."""

from pathlib import Path

import pytest

from crl.eval.encoder import SentenceTransformerEncoder
from crl.mine import MiningOptions, mine_hard_negatives

# Margins of exactly 0 are left out: a candidate that scores the positive's own score (the same
# text) is then kept or dropped by the last bit of two encodings' rounding (it failed once in a
# fresh environment); 0.001 keeps every margin code path and no such tie.
OPTIONS = [
    {},
    {"num_negatives": 5, "range_min": 3, "range_max": 25},
    {"margin": 0.001},
    {"relative_margin": 0.01, "num_negatives": 4},
    {"relative_margin": 0.001, "max_score": 0.95, "range_min": 1, "num_negatives": 8},
    {"min_score": 0.93, "margin": 0.001, "range_max": 40},
]
PEER_NAMES = {"margin": "absolute_margin"}


class Memo:
    """An encoder that embeds each list of texts once (the options change, not the texts)."""

    def __init__(self, encoder) -> None:
        self.encoder, self.seen = encoder, {}

    def encode_queries(self, texts):
        key = ("q", tuple(texts))
        if key not in self.seen:
            self.seen[key] = self.encoder.encode_queries(texts)
        return self.seen[key]

    def encode_documents(self, texts):
        key = ("d", tuple(texts))
        if key not in self.seen:
            self.seen[key] = self.encoder.encode_documents(texts)
        return self.seen[key]


@pytest.fixture(scope="module")
def peer_model(st_model_dir: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(st_model_dir), device="cpu")


@pytest.fixture(scope="module")
def encoder(st_model_dir: Path) -> Memo:
    return Memo(SentenceTransformerEncoder.load(st_model_dir, batch_size=32))  # the peer's own


def peer_negatives(model, anchors: list[str], positives: list[str],
                   options: dict) -> dict[tuple[str, str], list[str]]:
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives as st_mine

    k = options.get("num_negatives", 3)
    out = st_mine(Dataset.from_dict({"q": anchors, "p": positives}), model,
                  output_format="n-tuple", verbose=False, batch_size=32,
                  **{PEER_NAMES.get(key, key): v for key, v in options.items()})
    return {(row["q"], row["p"]): [row[f"negative_{i}"] for i in range(1, k + 1)]
            for row in out}


@pytest.mark.parametrize("options", OPTIONS, ids=[str(o) for o in OPTIONS])
def test_same_negatives_as_sentence_transformers(peer_model, encoder: Memo, pairs,
                                                 options) -> None:
    anchors, positives = pairs
    expected = peer_negatives(peer_model, anchors, positives, options)
    assert 0 < len(expected)
    for backend in ("torch", "faiss"):
        mined = mine_hard_negatives(anchors, positives, encoder,
                                    options=MiningOptions(**options), backend=backend,
                                    block=7)  # several corpus blocks
        got = {(a, b): negs for a, b, negs in zip(anchors, positives, mined.negatives,
                                                   strict=True) if negs is not None}
        assert got == expected, backend
