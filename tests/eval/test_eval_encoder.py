"""``crl.eval.encoder.load_encoder``: the one loader of ``minilm | PATH | RUN`` that ``crl eval
--model``, ``crl mine --model`` and ``loss.guide.model`` share: one message for a bad spec in
all three, and an :class:`Encoder` that is a :class:`TextEncoder` (unit rows, tower a for
queries, tower b for documents)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from crl.cli import app
from crl.errors import CrlValueError
from crl.eval.encoder import SentenceTransformerEncoder, encoder_kind, load_encoder

runner = CliRunner()
TEXTS = ["return the sum of two numbers", "def add(a, b): return a + b", "open a file"]

BAD: dict[str, Callable[[Path], Path]] = {
    "no such path": lambda tmp: tmp / "nowhere",
    "not a directory": lambda tmp: _touch(tmp / "model.txt"),
    "config.json but no checkpoint.pt": lambda tmp: _touch(tmp / "half" / "config.json"),
    "a directory holding ['notes.md']": lambda tmp: _touch(tmp / "junk" / "notes.md").parent,
}


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    return path.parent if path.name == "config.json" else path


def _pairs(tmp: Path) -> Path:
    path = tmp / "pairs.jsonl"
    path.write_text("".join(json.dumps({"a": f"query {i} {w}", "b": f"doc {i} {w}"}) + "\n"
                            for i, w in enumerate(["x", "y", "z", "w"])))
    return path


@pytest.mark.parametrize("found", list(BAD))
def test_a_bad_spec_gets_one_message_from_eval_mine_and_the_guide(found: str,
                                                                  tmp_path: Path) -> None:
    spec = BAD[found](tmp_path)
    with pytest.raises(CrlValueError) as caught:
        load_encoder(spec)
    message = str(caught.value)
    assert message.startswith("--model: expected 'minilm', a run directory") and found in message
    data = _pairs(tmp_path)
    for args in (["eval", "--model", str(spec), "--data", str(data)],
                 ["mine", str(data), "--model", str(spec), "--out", str(tmp_path / "m.jsonl")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert result.stderr.strip().splitlines() == [f"error: {message}"], result.stderr
    with pytest.raises(CrlValueError, match=r"^loss\.guide\.model: expected 'minilm'"):
        encoder_kind(spec, where="loss.guide.model")


def test_a_model_directory_is_a_text_encoder(tiny_bert: Path) -> None:
    encoder = load_encoder(tiny_bert, batch_size=2)
    assert encoder.kind == "pretrained" and encoder_kind(tiny_bert) == "pretrained"
    queries, documents = encoder.encode_queries(TEXTS), encoder.encode_documents(TEXTS)
    assert queries.dtype == torch.float32 and queries.shape == (3, encoder.encode(TEXTS).shape[1])
    torch.testing.assert_close(queries.norm(dim=1), torch.ones(3))
    # one tower for both views: a query and a document of the same text embed alike
    torch.testing.assert_close(queries, documents)
    torch.testing.assert_close(queries, torch.nn.functional.normalize(encoder.encode(TEXTS)))


def test_minilm_is_sentence_transformers_own_embedding_through_the_cache(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from crl.models.text import minilm_model_dir

    encoder = load_encoder("minilm", cache_dir=tmp_path, batch_size=2)
    ours = encoder.encode_queries(TEXTS)
    peer = SentenceTransformerEncoder(SentenceTransformer(str(minilm_model_dir()), device="cpu"))
    torch.testing.assert_close(ours, peer.encode_documents(TEXTS), atol=1e-5, rtol=0)
    cached = list((tmp_path / "text_features").rglob("*"))
    assert any(p.is_file() for p in cached)  # embedded once, kept for the next run
    again = load_encoder("minilm", cache_dir=tmp_path).encode_documents(TEXTS)
    torch.testing.assert_close(again, ours)
