"""Shared fixtures of the mining tests: the tiny BERT as a sentence-transformers directory, and
pairs with repeated anchors and repeated positives."""

import random
from pathlib import Path

import pytest

from tiny_bert import WORDS


@pytest.fixture(scope="session")
def st_model_dir(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BERT with mean pooling, saved as a sentence-transformers directory."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    model = SentenceTransformer(modules=[Transformer(str(tiny_bert)), Pooling(32, "mean")],
                                device="cpu")
    out = tmp_path_factory.mktemp("st-tiny")
    model.save(str(out))
    return out


def make_pairs(n: int = 60, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` (anchor, positive) pairs of random words: anchors 0 and 1 repeat (a query with
    two positives, and an exact duplicate row), one positive text serves two anchors."""
    rng = random.Random(seed)
    anchors = [" ".join(rng.choices(WORDS, k=4)) + f" {i}" for i in range(n)]
    positives = [" ".join(rng.choices(WORDS, k=7)) for _ in range(n)]
    anchors[5], anchors[9] = anchors[0], anchors[1]  # a query with two positives
    positives[9] = positives[1]  # ... and a duplicate row
    positives[12] = positives[3]  # one positive text, two anchors
    return anchors, positives


@pytest.fixture(scope="session")
def pairs() -> tuple[list[str], list[str]]:
    return make_pairs()
