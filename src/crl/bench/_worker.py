"""The process a benchmark measurement runs in: ``python -m crl.bench._worker < tasks.json``.

Reads a JSON list of tasks from stdin, runs them in order and prints one JSON list of results on
stdout. A task is a dict with ``kind`` in ``matmul``, ``loss``, ``retrieval`` (see the
``_run_*`` functions); each result carries the best time in seconds, the resident memory when the
task started (``baseline_rss``) and the process's peak resident memory after it (``peak_rss``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from crl.bench._measure import best_time, cpu_seconds, current_rss, matmul_gflops, peak_rss

#: Task ``dtype`` names.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _pairs(n: int, dim: int, seed: int) -> tuple[Tensor, Tensor]:
    """Unit-norm ``(n, dim)`` pairs whose partners are noisy copies (a partly trained model)."""
    gen = torch.Generator().manual_seed(seed)
    a = F.normalize(torch.randn(n, dim, generator=gen), dim=1)
    noise = torch.randn(n, dim, generator=gen)
    b = F.normalize(a + noise.mul_(1.5), dim=1)
    return a, b


def open_clip_loss(a: Tensor, b: Tensor, scale: Tensor) -> Tensor:
    """open_clip's ``ClipLoss`` on one process (two products, cross-entropy both ways)."""
    labels = torch.arange(a.shape[0])
    return (F.cross_entropy(scale * a @ b.T, labels) + F.cross_entropy(scale * b @ a.T, labels)) / 2


def _loss_fn(impl: str, block_size: int | None) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    import crl.losses.tiled as tiled
    from crl.losses import clip_loss

    if impl == "open_clip":
        return open_clip_loss
    if impl == "plain":  # crl's plain (B, B) path at any batch size
        return lambda a, b, s: clip_loss(a, b, s, block_size="plain")
    if impl == "tiled":
        block = block_size or tiled.DEFAULT_BLOCK_SIZE  # tiles at every batch size
        return lambda a, b, s: clip_loss(a, b, s, block_size=block)
    raise ValueError(f"unknown loss implementation {impl!r}")


def _run_loss(task: dict[str, Any]) -> dict[str, Any]:
    """Forward + backward of the CLIP loss on ``(batch, dim)`` embeddings of ``task["dtype"]``
    (default float32; the learnable scale is float32), wall and CPU seconds per call; with
    ``reference``, the last call's loss and gradients against float64 on the same (unrounded)
    embeddings; with ``matmul_n``, the ``(n, n)`` product's rate in the loss's dtype measured in
    this process just before and just after the loss's timing (``matmul_repeats`` runs each)."""
    baseline = current_rss()
    a0, b0 = _pairs(task["batch"], task["dim"], task.get("seed", 0))
    dtype = DTYPES[task.get("dtype", "float32")]
    a, b = a0.to(dtype).requires_grad_(True), b0.to(dtype).requires_grad_(True)
    scale = torch.tensor(task.get("scale", 1 / 0.07), requires_grad=True)
    fn = _loss_fn(task["impl"], task.get("block_size"))
    values: list[float] = []
    cpu: list[float] = []

    def step() -> None:
        start = cpu_seconds()
        a.grad = b.grad = scale.grad = None
        loss = fn(a, b, scale)
        loss.backward()  # type: ignore[no-untyped-call]
        values.append(float(loss.detach()))
        cpu.append(cpu_seconds() - start)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    side, tries = task.get("matmul_n"), task.get("matmul_repeats", 1)
    before = matmul_gflops(side, tries, dtype) if side else None  # the reference, in-process
    seconds, times = best_time(step, task.get("repeats", 1), task.get("warmup", 0))
    after = matmul_gflops(side, tries, dtype) if side else None
    assert a.grad is not None and b.grad is not None and scale.grad is not None
    out = {"seconds": seconds, "times": times, "cpu_seconds": min(cpu[-len(times):]),
           "matmul_gflops_same_process": (None if before is None or after is None
                                          else [round(before, 2), round(after, 2)]),
           "loss": values[-1],
           "grad_norm": float(torch.cat([a.grad.flatten(), b.grad.flatten()]).double().norm()),
           "grad_dtype": str(a.grad.dtype).removeprefix("torch."),
           "scale_grad": float(scale.grad), "baseline_rss": baseline, "peak_rss": peak_rss(),
           "loadavg_1min_start_end": [round(load, 2), round(os.getloadavg()[0], 2)
                                      if hasattr(os, "getloadavg") else None]}
    if task["impl"] == "tiled" and dtype in (torch.bfloat16, torch.float16):
        out["backward_route"] = _backward_route(dtype, task.get("block_size"), task["batch"],
                                               task["dim"])
    if task.get("reference"):
        out.update(_against_float64(fn, a0, b0, (a.grad, b.grad, scale.grad), values[-1],
                                    float(scale.detach())))
    return out


def _backward_route(dtype: torch.dtype, block_size: int | None, batch: int, dim: int) -> str:
    """Which backward this process's narrow-dtype in-batch tiles took (the kernel's probe,
    cached, so the one the timed calls used): ``"factored"`` or ``"formed"``."""
    import crl.losses.tiled as tiled
    from crl.losses._tile_negatives import TileNegatives
    from crl.losses._tiled_kernel import factored_backward, tile_workers

    block = block_size or tiled.DEFAULT_BLOCK_SIZE
    cpu = torch.device("cpu")
    in_batch = TileNegatives(None, None, None, None, include_positive=True)
    workers = tile_workers(cpu, in_batch, -(-batch // block))
    factored = factored_backward(cpu, dtype, block, dim, workers=workers)
    return "factored" if factored else "formed"


def _against_float64(fn: Callable[[Tensor, Tensor, Tensor], Tensor], a0: Tensor, b0: Tensor,
                     grads: tuple[Tensor, Tensor, Tensor], loss: float, scale: float
                     ) -> dict[str, Any]:
    """The same loss in float64 on the unrounded embeddings: relative loss error, gradient
    cosine similarity (``a`` and ``b`` together) and the scale gradient's relative error."""
    a, b = a0.double().requires_grad_(True), b0.double().requires_grad_(True)
    s = torch.tensor(scale, dtype=torch.float64, requires_grad=True)
    exact = fn(a, b, s)
    exact.backward()  # type: ignore[no-untyped-call]
    assert a.grad is not None and b.grad is not None and s.grad is not None
    got = torch.cat([grads[0].flatten(), grads[1].flatten()]).double()
    want = torch.cat([a.grad.flatten(), b.grad.flatten()])
    return {"float64_loss": float(exact.detach()),
            "loss_rel_diff_vs_float64": abs(loss - float(exact.detach()))
            / abs(float(exact.detach())),
            "grad_cosine_vs_float64": float(F.cosine_similarity(got, want, dim=0)),
            "scale_grad_rel_diff_vs_float64": abs(float(grads[2]) - float(s.grad))
            / abs(float(s.grad))}


def _ranks_from_topk(labels: Any, k: int) -> dict[str, float]:
    import numpy as np

    hits = labels == np.arange(labels.shape[0])[:, None]  # (N, k)
    return {f"x2y_recall@{j}": float(hits[:, :j].any(axis=1).mean()) for j in (1, 5, k)}


def _run_retrieval(task: dict[str, Any]) -> dict[str, Any]:
    """All of ``retrieval_metrics`` (``impl="crl"``) or a faiss ``IndexFlatIP`` top-k search."""
    # Imported before the baseline so that libraries count in it, not in the measurement.
    if task["impl"] == "faiss":
        import faiss
    from crl.eval import retrieval_metrics

    baseline = current_rss()
    a, b = _pairs(task["n"], task["dim"], task.get("seed", 0))
    k = task.get("k", 10)
    out: dict[str, Any] = {}
    if task["impl"] == "crl":

        def run() -> None:
            out.update(retrieval_metrics(a, b, ks=(1, 5, k), block_size=task.get("block_size",
                                                                                   4096)))
    elif task["impl"] == "faiss":
        a_np, b_np = a.numpy(), b.numpy()

        def run() -> None:
            index = faiss.IndexFlatIP(b_np.shape[1])
            index.add(b_np)
            _, labels = index.search(a_np, k)
            out.update(_ranks_from_topk(labels, k))
    else:
        raise ValueError(f"unknown retrieval implementation {task['impl']!r}")
    seconds, times = best_time(run, task.get("repeats", 1), task.get("warmup", 0))
    return {"seconds": seconds, "times": times, "metrics": out, "baseline_rss": baseline,
            "peak_rss": peak_rss()}


def _run_matmul(task: dict[str, Any]) -> dict[str, Any]:
    dtype = DTYPES[task.get("dtype", "float32")]
    return {"gflops": matmul_gflops(task["n"], task.get("repeats", 3), dtype)}


_KINDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "loss": _run_loss,
    "retrieval": _run_retrieval,
    "matmul": _run_matmul,
}


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """Run one task; return it merged with its result."""
    return {**task, **_KINDS[task["kind"]](task)}


def main() -> None:
    """Run the tasks read from stdin; print their results as one JSON line."""
    tasks = json.loads(sys.stdin.read())
    print(json.dumps([run_task(task) for task in tasks]))


if __name__ == "__main__":
    main()
