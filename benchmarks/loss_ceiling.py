"""How close the float32 tiled CLIP loss comes to the rate its own matrix products allow.

``crl bench loss`` compares the tiled loss (forward and backward, ``8 B² D`` flops) with one
``4096 x 4096`` product. The kernel cannot beat the rate of the products it is made of: four
per tile (``L = a_s[R] b[C]^T`` in the forward, the same again in the backward, ``G b[C]`` and
``G^T a_s[R]``), on ``T x T`` tiles with ``K = D`` or ``K = T``, run as the kernel runs them
(the same tiles, the same streams of row blocks, :func:`~crl.losses._tiled_kernel.tile_workers`
and :func:`~crl.losses._tiled_kernel.run_streams`). This script times, alternating in one
process for ``--rounds`` rounds:

- ``product``: the ``4096²`` float32 product, the fastest of 3 (``crl bench loss``'s reference);
- ``loss``: ``crl.losses.clip_loss(a, b, scale, block_size=T)`` forward and backward on
  ``crl bench loss``'s embeddings (learnable scale ``1/0.07``);
- ``products``: the kernel's four products per tile and nothing else (its ceiling);
- ``exp2``: ``Tensor.exp2_`` over one ``T x T`` tile on one thread, in ns per element; the kernel
  takes it twice per tile (forward and backward) and it does not run on the matrix units.

It reports each rate in GFLOP/s of ``8 B² D`` and the shares ``loss / product``, ``products /
product`` and ``loss / products`` (the share of the products' own time that the element-wise
passes and the merges leave), medians over the rounds. Run from the repository root (about a
minute per round at B = 16,384 on two cores):

    .venv/bin/python benchmarks/loss_ceiling.py --out benchmarks/results/loss_ceiling.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from crl.bench._measure import matmul_gflops
from crl.bench._worker import _pairs
from crl.env import environment_info
from crl.losses import clip_loss
from crl.losses._tile_math import spans
from crl.losses._tile_negatives import TileNegatives
from crl.losses._tiled_kernel import run_streams, tile_workers
from crl.losses.tiled import DEFAULT_BLOCK_SIZE
from crl.rundir.files import write_json

_IN_BATCH = TileNegatives(None, None, None, None, include_positive=True)  # in-batch: no mask


def stream_count(n: int, block: int) -> int:
    """How many streams the kernel runs for float32 in-batch tiles of ``block`` over ``n``."""
    return tile_workers(torch.device("cpu"), _IN_BATCH,
                        -(-n // block))


def products_only(a: Tensor, b: Tensor, block: int) -> float:
    """Seconds of the tiled kernel's four products per tile over ``(B, D)`` ``a`` and ``b``, in
    its tiles and streams, with nothing else (the products' outputs are overwritten or summed
    exactly as the kernel's are)."""
    n, dim = a.shape
    workers = stream_count(n, block)
    row_spans = list(spans(n, block))

    def stream(k: int, count: int) -> None:
        tile = a.new_empty(block, block)
        acc_a = a.new_zeros(n, dim)
        acc_b = a.new_zeros(n, dim)
        for r0, r1 in row_spans[k::count]:
            for c0, c1 in spans(n, block):
                logits = tile[: r1 - r0, : c1 - c0]
                torch.mm(a[r0:r1], b[c0:c1].T, out=logits)  # the forward's product
                torch.mm(a[r0:r1], b[c0:c1].T, out=logits)  # the backward's recomputation
                acc_a[r0:r1].addmm_(logits, b[c0:c1])  # G @ b[C]
                acc_b[c0:c1].addmm_(logits.T, a[r0:r1])  # G^T @ a_s[R]

    start = time.perf_counter()
    run_streams(workers, stream, a.device.type)
    return time.perf_counter() - start


def loss_seconds(a: Tensor, b: Tensor, scale: Tensor, block: int) -> float:
    """Seconds of one forward and backward of the tiled CLIP loss."""
    a.grad = b.grad = scale.grad = None
    start = time.perf_counter()
    clip_loss(a, b, scale, block_size=block).backward()  # type: ignore[no-untyped-call]
    return time.perf_counter() - start


def exp2_ns_per_element(block: int, repeats: int = 50) -> float:
    """``Tensor.exp2_`` over a ``block x block`` float32 tile on one thread, ns per element."""
    tile = torch.randn(block, block)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for _ in range(repeats):
            tile.clamp_(-20.0, 20.0)
            start = time.perf_counter()
            tile.exp2_()
            best = min(best, time.perf_counter() - start)
            tile.log2_()
    finally:
        torch.set_num_threads(threads)
    return best / tile.numel() * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--product-side", type=int, default=4096,
                        help="side n of the (n, n) @ (n, n) reference product")
    parser.add_argument("--out", type=Path, default=Path("runs") / "bench" / "loss_ceiling.json")
    args = parser.parse_args()
    n, dim, block = args.batch_size, args.dim, args.block_size
    flops = 8.0 * n * n * dim
    a0, b0 = _pairs(n, dim, 0)
    a, b = a0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
    scale = torch.tensor(1 / 0.07, requires_grad=True)
    a_s = (a0 / 0.07).contiguous()
    loss_seconds(a, b, scale, block)  # warm-up: the allocator, the first tiles
    products_only(a_s, b0, block)
    load_before = os.getloadavg()
    rounds: list[dict[str, Any]] = []
    for k in range(args.rounds):
        product = matmul_gflops(args.product_side, 3)
        loss = loss_seconds(a, b, scale, block)
        products = products_only(a_s, b0, block)
        product_after = matmul_gflops(args.product_side, 3)
        reference = max(product, product_after)
        row = {"product_gflops": [round(product, 1), round(product_after, 1)],
               "loss_seconds": round(loss, 6), "products_seconds": round(products, 6),
               "loss_gflops": round(flops / loss / 1e9, 1),
               "products_gflops": round(flops / products / 1e9, 1),
               "loss_share_of_product": round(flops / loss / 1e9 / reference, 4),
               "products_share_of_product": round(flops / products / 1e9 / reference, 4),
               "loss_share_of_products": round(products / loss, 4),
               "loadavg_1min": round(os.getloadavg()[0], 2)}
        rounds.append(row)
        print(f"round {k + 1}: product {reference:.0f} GFLOP/s, loss {loss:.2f} s "
              f"({row['loss_share_of_product']:.0%}), products alone {products:.2f} s "
              f"({row['products_share_of_product']:.0%}), loss at "
              f"{row['loss_share_of_products']:.0%} of its products' rate", file=sys.stderr)
    exp2 = exp2_ns_per_element(block)
    workers = stream_count(n, block)
    loss_median = statistics.median(r["loss_seconds"] for r in rounds)
    exp2_seconds = 2 * n * n * exp2 * 1e-9 / workers  # two exp2 passes per tile, per stream
    result = {
        "benchmark": "float32 tiled CLIP loss against the ceiling of its own products",
        "config": {"batch_size": n, "dim": dim, "block_size": block, "rounds": args.rounds,
                   "product_side": args.product_side,
                   "streams": workers, "flops_per_forward_backward": "8 * B^2 * D"},
        "environment": environment_info(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "rounds": rounds,
        "median": {key: statistics.median(r[key] for r in rounds)
                   for key in ("loss_share_of_product", "products_share_of_product",
                               "loss_share_of_products", "loss_seconds", "products_seconds")},
        "exp2_ns_per_element_one_thread": round(exp2, 3),
        "exp2_share_of_loss": round(exp2_seconds / loss_median, 4),
    }
    write_json(args.out, result)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
