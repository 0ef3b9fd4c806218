"""A trained run used elsewhere: its model rebuilt from ``config.json`` and ``checkpoint.pt``,
exported as a sentence-transformers directory (``crl export``) or embedding a file's texts
(``crl encode``).

A run directory is data, never code: its config is read by :func:`read_run_config`, which
refuses a ``model.kind: custom`` factory the caller did not name (docs/errors.md, "Files run no
code")."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from crl.data import DataInfo, load_data
from crl.data.files import read_texts
from crl.errors import CrlError, CrlValueError
from crl.models import DualEncoder, build_model
from crl.models.custom import check_trusted
from crl.models.encode import encode_texts
from crl.rundir import CHECKPOINT_FILE, CONFIG_FILE, atomic_write, read_json
from crl.train.build import seed_everything
from crl.train.checkpoint import load_checkpoint
from crl.train.config import TrainConfig, config_hash
from crl.train.loading import validate_config

if TYPE_CHECKING:
    from crl.models.export import ExportTower

View = Literal["a", "b"]


@dataclass
class TrainedModel:
    """A run's config, its model with the checkpoint's weights (eval mode), and its data info."""

    config: TrainConfig
    model: DualEncoder
    info: DataInfo
    step: int


def read_run_config(run_dir: str | Path, *,
                    trusted_factories: Collection[str] = ()) -> TrainConfig:
    """The config a run directory's ``config.json`` holds, validated; refused when it names
    code to run (a ``model.kind: custom`` factory) that is not in ``trusted_factories``.

    Every reader of a run directory's config goes through here, so whether a factory may be
    imported is decided once, by the caller (the command line's ``--trust-factory``), before
    anything else is read.

    Args:
        run_dir: A run directory written by :func:`crl.train.fit`.
        trusted_factories: The factories (``"package.module:function"``) the caller names as
            safe to import; empty: none.

    Raises:
        CrlError: if the directory has no ``config.json``, the config is invalid, or it names
            a factory that is not trusted (nothing is imported).
    """
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise CrlError(f"{run_dir} is not a run directory (no {CONFIG_FILE})")
    config = validate_config(read_json(path).get("config", {}), str(path))
    check_trusted(config.model, trusted_factories, origin=str(path))
    return config


def load_trained(run_dir: str | Path, *, device: str = "cpu",
                 trusted_factories: Collection[str] = ()) -> TrainedModel:
    """Rebuild the model of a run directory and load its checkpoint's weights.

    Args:
        run_dir: A run directory written by :func:`crl.train.fit`.
        device: Where the model goes.
        trusted_factories: See :func:`read_run_config`.

    Raises:
        CrlError: if the directory has no config or checkpoint, they do not match, or the
            config names a factory that is not trusted.
    """
    run_dir = Path(run_dir)
    config = read_run_config(run_dir, trusted_factories=trusted_factories)
    state = load_checkpoint(run_dir / CHECKPOINT_FILE, config_hash=config_hash(config))
    info = load_data(config.data, progress=False).info
    seed_everything(config.train.seed)
    model = build_model(config.model, info)
    model.load_state_dict(state["model"])
    model.to(torch.device(device)).eval()
    return TrainedModel(config, model, info, int(state["step"]))


def export_run(run_dir: str | Path, out: str | Path, *,
               format: str = "sentence-transformers", tower: ExportTower = "both",
               trusted_factories: Collection[str] = ()) -> Path:
    """Export a run's model (``crl export``); see :mod:`crl.models.export`.

    ``tower``: ``both`` (default; two towers become one model with ``encode_query`` and
    ``encode_document``), ``a`` or ``b``. ``trusted_factories``: see :func:`read_run_config`.

    Raises:
        CrlValueError: for an unknown format, a model that cannot be exported or an ``out``
            that holds files.
    """
    from crl.models.export import FORMATS, check_tower, export_sentence_transformers
    from crl.models.transformer import resolve_model_dir

    if format not in FORMATS:
        raise CrlValueError(f"export: unknown format {format!r}; formats: {', '.join(FORMATS)}")
    check_tower(tower)  # before the run is loaded
    trained = load_trained(run_dir, trusted_factories=trusted_factories)
    if trained.config.model.kind != "transformer":
        raise CrlValueError(
            f"export: only models of kind 'transformer' export to {format}; the run "
            f"{run_dir} trained kind {trained.config.model.kind!r}"
        )
    matryoshka = trained.config.loss.matryoshka
    return export_sentence_transformers(
        trained.model, out, model_dir=resolve_model_dir(trained.config.model.pretrained),
        tower=tower, matryoshka_dims=matryoshka.dims if matryoshka is not None else ())


def encode_file(run_dir: str | Path, file: str | Path, out: str | Path, *, view: View = "a",
                column: str | None = None, batch_size: int = 256, device: str = "cpu",
                progress: bool = True, trusted_factories: Collection[str] = ()) -> np.ndarray:
    """Embed the texts of one column of ``file`` with a run's model; save them to ``out``.

    Args:
        run_dir: A run directory written by :func:`crl.train.fit`.
        file: A table of texts (any format of ``data.files``).
        out: The ``.npy`` file to write (atomically): float32 ``(N, D)``, row ``i`` the
            ``i``-th text.
        view: The tower: ``a`` (queries) or ``b`` (documents).
        column: The column to embed (None: the run's ``data.files.columns`` name of ``view``).
        batch_size: Texts per forward pass.
        device: Where the model runs.
        progress: Show a progress bar.
        trusted_factories: See :func:`read_run_config`.

    Returns:
        The embeddings ``(N, D)``.

    Raises:
        CrlValueError: for a bad file, column or cell (naming the row), a model that takes
            no text, or an ``out`` that is a directory.
    """
    if view not in ("a", "b"):
        raise CrlValueError(f"encode: `view` must be 'a' or 'b'; got {view!r}")
    out = Path(out)
    if out.is_dir():  # before the work, not after it
        raise CrlValueError(f"encode: --out {out} is a directory; give the .npy file to write, "
                            f"e.g. {out / 'embeddings.npy'}")
    trained = load_trained(run_dir, device=device, trusted_factories=trusted_factories)
    columns = trained.config.data.files.columns
    texts = read_texts(file, column or (columns.a if view == "a" else columns.b))
    embeddings = encode_texts(trained.model, texts, view=view, batch_size=batch_size,
                              device=device, progress=progress).numpy()
    atomic_write(out, lambda f: np.save(f, embeddings.astype(np.float32)))  # never half an array
    return embeddings


__all__ = ["TrainedModel", "encode_file", "export_run", "load_trained", "read_run_config"]
