"""Checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint holds the model, the objective (GCL's ``u`` buffers, SigLIP's scale and bias,
learnable temperatures), the optimiser and scheduler, the RNG states (torch, numpy, python), the
step, the epoch and the position in it, the config and its hash, and crl's version (nanoGPT's
``ckpt.pt`` carries its config the same way). It is written atomically.

A checkpoint holds only tensors and plain values (dicts, lists, tuples, numbers, strings): the
numpy RNG state is stored as a tensor, not a pickled array. It is read with
``torch.load(weights_only=True)``, whose unpickler builds nothing else, so a checkpoint from
someone else's run directory cannot run code; one that asks for anything else is refused.
"""

from __future__ import annotations

import io
import pickle
import random
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from crl import __version__
from crl._unpickling import pickled_globals, refused_request, unpickler_reason
from crl.errors import CrlError, StaleRunError
from crl.rundir import atomic_write

#: Keys every checkpoint has.
CHECKPOINT_KEYS = ("model", "objective", "optimizer", "scheduler", "rng", "step", "epoch",
                   "position", "config", "config_hash", "crl_version")


def rng_state() -> dict[str, Any]:
    """The global RNG states of torch, numpy and python, as tensors and plain values.

    numpy's legacy state ``(name, key (624,) uint32, pos, has_gauss, cached_gaussian)`` becomes a
    dict with the key as an int64 tensor; python's ``(version, internal state, gauss_next)`` is
    a tuple of ints already.
    """
    name, key, pos, has_gauss, cached = np.random.get_state(legacy=True)  # noqa: NPY002
    numpy_state = {"name": str(name), "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
                   "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    saved = state["numpy"]
    np.random.set_state((saved["name"], saved["key"].numpy().astype(np.uint32),  # noqa: NPY002
                         saved["pos"], saved["has_gauss"], saved["cached_gaussian"]))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def same_rng_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two :func:`rng_state` results are the same states (nothing drew between)."""
    return (torch.equal(a["torch"], b["torch"]) and a["python"] == b["python"]
            and torch.equal(a["numpy"]["key"], b["numpy"]["key"])
            and a["numpy"]["pos"] == b["numpy"]["pos"]
            and a["numpy"]["has_gauss"] == b["numpy"]["has_gauss"])


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` (a dict with :data:`CHECKPOINT_KEYS`) atomically with ``torch.save``."""
    missing = [k for k in CHECKPOINT_KEYS if k not in state]
    if missing:
        raise CrlError(f"save_checkpoint: the state lacks {missing}")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write(path, lambda f: f.write(buffer.getbuffer()))


def load_checkpoint(path: str | Path, *, config_hash: str | None = None) -> dict[str, Any]:
    """Read a checkpoint and check it belongs to this config and this crl version.

    Args:
        path: The ``checkpoint.pt`` file.
        config_hash: The hash of the config the run is resumed with (None: not checked).

    Returns:
        The state dict.

    Raises:
        CrlError: if the file is missing, truncated or corrupt, or holds anything but tensors
            and plain values (refused without running any of it); :class:`StaleRunError` if it
            was written for another config or another crl version. Nothing is changed on disk.
    """
    path = Path(path)
    if not path.is_file():
        raise CrlError(f"no checkpoint at {path}: the run has not written one yet (every "
                       "train.checkpoint_every steps and at its end); start it without --resume")
    try:
        # torch.load does not check the zip entries' CRC-32: flipped bytes in the tensor data
        # would load as silently wrong weights, so the archive is verified first. A file that
        # is not a zip goes to torch.load as it is (torch's legacy format, or a bare pickle).
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
            if bad is not None:
                raise ValueError(f"entry {bad} fails its CRC-32 check")
        # weights_only=True: the unpickler builds tensors and plain values only, so a file that
        # asks for anything else (a function to call on load) fails here and nothing runs.
        with warnings.catch_warnings():  # a pickle of protocol > 2 is refused in one line below
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        request = refused_request(exc) or pickled_globals(path)
        if request is None:  # a damaged opcode, not a request for code
            raise _corrupt(path, exc) from None
        raise CrlError(
            f"checkpoint {path} holds objects other than tensors and plain values ({request}): "
            "pickled code or objects, which crl refuses to load (it reads checkpoints with "
            "weights_only=True) and did not run; the file was not written by crl or was "
            "tampered with: delete it, or re-create it from a run you trust"
        ) from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile,
            ValueError, MemoryError, KeyError, AttributeError, ImportError, TypeError,
            UnicodeDecodeError, AssertionError, IndexError) as exc:
        # Unpickling damaged bytes can raise almost anything (a MemoryError for a huge storage
        # size); every one of them means the same thing here.
        raise _corrupt(path, exc) from None
    if not isinstance(state, dict) or any(k not in state for k in CHECKPOINT_KEYS):
        raise CrlError(f"{path} is not a crl checkpoint (missing keys); delete it to "
                       "start over")
    if state["crl_version"] != __version__:
        raise StaleRunError(
            f"checkpoint {path} was written by crl {state['crl_version']}, this is crl "
            f"{__version__}; resume it with that version or start a new run"
        )
    if config_hash is not None and state["config_hash"] != config_hash:
        raise StaleRunError(
            f"checkpoint {path} belongs to config {state['config_hash']}, not to the "
            f"given config {config_hash}; resume with the config in {path.parent / 'config.json'}"
        )
    return state


def _corrupt(path: Path, exc: BaseException) -> CrlError:
    return CrlError(f"checkpoint {path} is truncated or corrupt ({type(exc).__name__}: "
                    f"{unpickler_reason(exc)}); delete it to start over")


__all__ = ["CHECKPOINT_KEYS", "load_checkpoint", "rng_state", "same_rng_state",
           "save_checkpoint", "set_rng_state"]
