"""Towers and DualEncoder: shapes, normalisation, shared towers, per-sample independence."""

from __future__ import annotations

import itertools

import pytest
import torch
from pydantic import ValidationError

from crl.data import DataInfo, TensorPairDataset
from crl.errors import CrlValueError
from crl.models import ModelConfig, SmallCNN, build_model, resolve_kind
from crl.models.bag import EmbeddingBagEncoder

VECTOR = DataInfo("vector", 3, 5, None, None, "toy")
SQUARE = DataInfo("vector", 4, 4, None, None, "square")
IMAGE = DataInfo("image", None, None, (1, 8, 8), 10, "digits")


def _inputs(info: DataInfo, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if info.kind == "image":
        return torch.rand(n, 1, 8, 8, generator=g), torch.rand(n, 1, 8, 8, generator=g)
    assert info.dim_a is not None and info.dim_b is not None
    return torch.randn(n, info.dim_a, generator=g), torch.randn(n, info.dim_b, generator=g)


CASES = [("linear", VECTOR), ("mlp", VECTOR), ("linear", IMAGE), ("mlp", IMAGE), ("cnn", IMAGE)]


@pytest.mark.parametrize(("kind", "info"), CASES)
@pytest.mark.parametrize("normalize", [True, False])
def test_output_shapes_and_normalisation(kind: str, info: DataInfo, normalize: bool) -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind=kind, embed_dim=16, hidden_dim=32,
                                    normalize=normalize), info)
    x, y = _inputs(info, 7)
    za, zb = model(x, y)
    assert za.shape == zb.shape == (7, 16)
    norms = torch.cat([za, zb]).norm(dim=1)
    if normalize:
        torch.testing.assert_close(norms, torch.ones(14))
    else:
        assert not torch.allclose(norms, torch.ones(14), atol=1e-3)
    assert model.represent_a(x).shape[0] == 7


@pytest.mark.parametrize(("kind", "info"), CASES)
def test_rows_do_not_depend_on_the_rest_of_the_batch(kind: str, info: DataInfo) -> None:
    torch.manual_seed(1)
    model = build_model(ModelConfig(kind=kind, embed_dim=8, hidden_dim=16), info)
    x, y = _inputs(info, 9)
    full = model.encode_a(x)
    perm = torch.randperm(9)
    torch.testing.assert_close(model.encode_a(x[perm]), full[perm], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(model.encode_a(x[2:3]), full[2:3], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(model.encode_b(y[:4]), model.encode_b(y)[:4], atol=1e-6, rtol=1e-5)


def test_default_kinds_and_shared_towers() -> None:
    assert resolve_kind(ModelConfig(), VECTOR) == "mlp"
    assert resolve_kind(ModelConfig(), IMAGE) == "cnn"
    image_model = build_model(ModelConfig(), IMAGE)
    assert image_model.shared and image_model.tower_a is image_model.tower_b
    single = sum(p.numel() for p in image_model.tower_a.parameters())
    assert sum(p.numel() for p in image_model.parameters()) == single  # logit scale: objective
    x = torch.rand(3, 1, 8, 8)
    torch.testing.assert_close(image_model.encode_a(x), image_model.encode_b(x))
    two = build_model(ModelConfig(), SQUARE)
    assert not two.shared
    v = torch.randn(3, 4)
    assert not torch.allclose(two.encode_a(v), two.encode_b(v))
    shared = build_model(ModelConfig(shared_tower=True), SQUARE)
    torch.testing.assert_close(shared.encode_a(v), shared.encode_b(v))


def test_kind_errors() -> None:
    with pytest.raises(CrlValueError, match="'cnn' does not take vector data"):
        build_model(ModelConfig(kind="cnn"), VECTOR)
    with pytest.raises(CrlValueError, match=r"same dimension.*dim_a=3.*dim_b=5"):
        build_model(ModelConfig(shared_tower=True), VECTOR)
    with pytest.raises(CrlValueError, match="'transformer' does not take vector data"):
        build_model(ModelConfig(kind="transformer"), VECTOR)
    with pytest.raises(ValidationError, match=r"package\.module:function"):
        ModelConfig(kind="custom", factory="not a spec")
    with pytest.raises(ValidationError, match="extra"):
        ModelConfig(embedding_dim=3)


def test_gradients_reach_both_towers() -> None:
    # (The CLIP logit scale lives in the objective: tests/losses/test_objective_interface.py.)
    model = build_model(ModelConfig(kind="mlp", embed_dim=4), VECTOR)
    assert not hasattr(model, "logit_scale")
    x, y = _inputs(VECTOR, 6)
    za, zb = model(x, y)
    (za @ zb.T).logsumexp(dim=1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_prepare_is_identity_for_tensors() -> None:
    model = build_model(ModelConfig(), VECTOR)
    ds = TensorPairDataset(torch.zeros(4, 3), torch.zeros(4, 5))
    assert model.prepare(ds) is ds


def test_small_cnn_layer_sizes() -> None:
    cnn = SmallCNN((1, 8, 8), [8, 16, 32], 10)  # 8x8 -> 8x8 -> 4x4 -> 2x2
    assert cnn.out.in_features == 32 * 2 * 2
    assert cnn(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_embedding_bag_matches_mean_of_token_and_bigram_embeddings() -> None:
    torch.manual_seed(0)
    enc = EmbeddingBagEncoder(vocab_size=50, dim=6, bigram_buckets=7)
    ids = torch.tensor([[3, 9, 4, 0, 0], [0, 0, 0, 0, 0], [5, 5, 5, 5, 5]])
    out = enc(ids)
    weight = enc.bag.weight.detach()
    for row, seq in enumerate(ids.tolist()):
        tokens = [t for t in seq if t != 0]
        tokens += [50 + (s * 1_000_003 + t) % 7 for s, t in itertools.pairwise(seq)
                   if s != 0 and t != 0]
        expected = weight[tokens].mean(dim=0) if tokens else torch.zeros(6)
        torch.testing.assert_close(out[row], expected)
    plain = EmbeddingBagEncoder(vocab_size=50, dim=6)
    torch.testing.assert_close(plain(ids[:1])[0], plain.bag.weight.detach()[[3, 9, 4]].mean(0))
