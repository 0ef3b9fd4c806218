"""Run measurements in fresh processes and read their peak memory.

Every measurement runs ``python -m crl.bench._worker`` with a JSON list of tasks on stdin and reads
a JSON list of results from its stdout. A fresh process per measurement is what makes the peak
resident memory (``VmHWM`` of ``/proc/self/status``, or ``ru_maxrss`` where there is no
``/proc``) belong to that measurement alone; the worker also reports its resident memory after
``import torch, crl`` (the interpreter's baseline), so ``peak - baseline`` is what the measured
code added.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from crl.errors import CrlError

GIB = 1024**3


def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes (None without ``/proc``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def current_rss() -> int:
    """Resident memory of this process now, in bytes (the peak so far without ``/proc``)."""
    value = _status_bytes("VmRSS")
    return value if value is not None else peak_rss()


def peak_rss() -> int:
    """Peak resident memory of this process so far, in bytes."""
    value = _status_bytes("VmHWM")
    if value is not None:
        return value
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, kB on Linux
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def available_memory() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (all threads), in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return float(usage.ru_utime + usage.ru_stime)


def best_time(fn: Callable[[], object], repeats: int, warmup: int) -> tuple[float, list[float]]:
    """The fastest of ``repeats`` timed calls of ``fn`` after ``warmup`` untimed ones (seconds)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), times


def matmul_gflops(n: int, repeats: int = 3, dtype: torch.dtype = torch.float32) -> float:
    """This machine's matrix-product throughput: ``2 n³`` flops of an ``(n, n) @ (n, n)`` product
    over the fastest of ``repeats`` runs, in GFLOP/s, with torch's current thread count."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, n, generator=gen, dtype=dtype)
    y = torch.randn(n, n, generator=gen, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    seconds, _ = best_time(lambda: torch.mm(x, y, out=out), repeats, warmup=1)
    return 2.0 * n**3 / seconds / 1e9


def machine_state() -> dict[str, Any]:
    """What else the machine was doing: load averages, CPUs, threads, available memory."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    available = available_memory()
    return {
        "loadavg_1_5_15min": [round(x, 2) for x in load],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "mem_available_gib": None if available is None else round(available / GIB, 2),
    }


def run_in_subprocess(tasks: Sequence[dict[str, Any]], timeout: float | None = None
                      ) -> list[dict[str, Any]]:
    """Run ``tasks`` in one fresh ``python -m crl.bench._worker`` process; return its results.

    Raises:
        CrlError: if the worker fails (its stderr's last lines are in the message).
    """
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-m", "crl.bench._worker"],
        input=json.dumps(list(tasks)), capture_output=True, text=True, timeout=timeout,
        env=env, check=False,
    )
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        raise CrlError(f"benchmark worker failed with exit code {proc.returncode}: {tail}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    if not lines:
        raise CrlError(f"benchmark worker printed no result; stdout was {proc.stdout[-300:]!r}")
    results: list[dict[str, Any]] = json.loads(lines[-1])
    return results


def run_tasks(tasks: Sequence[dict[str, Any]], *, separate: bool,
              progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run each task in its own fresh process (``separate=True``, for memory figures) or all of
    them in this process (quick runs: no start-up cost, memory figures not separate);
    ``progress`` is told each task's name before it starts."""
    if not separate:
        from crl.bench._worker import run_task

        if progress is not None:
            progress(f"{len(tasks)} task(s) in this process")
        return [run_task(task) for task in tasks]
    results = []
    for task in tasks:
        if progress is not None:
            progress(str(task.get("name", task.get("kind"))))
        results.extend(run_in_subprocess([task]))
    return results


__all__ = [
    "GIB",
    "available_memory",
    "best_time",
    "cpu_seconds",
    "current_rss",
    "machine_state",
    "matmul_gflops",
    "peak_rss",
    "run_in_subprocess",
    "run_tasks",
]
