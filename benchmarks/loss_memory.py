"""Memory of the in-batch loss beside gradient caching: the peak resident growth of one forward
and backward pass of crl's CLIP loss (``crl.losses.clip_loss``, both directions) over ``(B, D)``
float32 embeddings, per ``B²`` float32 values (the ``(B, B)`` score matrices the plain path holds)
or per ``T²`` of its tiles (above ``B = 2048`` the loss runs in ``T x T`` tiles, ``T = 4096``).

The negatives study's memory estimate for an in-batch batch size
(:mod:`crl.experiments.negatives.memory`) takes its score term from here and its towers' term
from ``benchmarks/gradcache.py``. Each B is a fresh process with one torch thread: a warm-up
pass at B = 64, the peak reset (``/proc/self/clear_refs``), then the timed pass; the growth is
``VmHWM`` after it minus ``VmRSS`` before it, less the ``2 B D`` gradients of the embeddings.

    PYTHONPATH=src .venv/bin/python benchmarks/loss_memory.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
DIM = 384  # all-MiniLM-L6-v2's width, the study's in-batch answer's model


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker(batch: int) -> dict[str, Any]:
    """One pass at ``batch`` (a fresh process)."""
    import torch
    from torch.nn.functional import normalize

    from crl.losses import clip_loss
    from crl.losses.tiled import decide_tiles

    torch.set_num_threads(1)
    torch.manual_seed(0)
    a = torch.randn(batch, DIM, requires_grad=True)
    b = torch.randn(batch, DIM, requires_grad=True)
    clip_loss(normalize(a[:64], dim=1), normalize(b[:64], dim=1), 14.3).backward()
    a.grad = b.grad = None
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status_bytes("VmRSS")
    clip_loss(normalize(a, dim=1), normalize(b, dim=1), 14.3).backward()
    growth = _status_bytes("VmHWM") - before - 2 * 4 * batch * DIM
    tiles = decide_tiles("loss_memory", None, batch, batch)
    side = batch if tiles == "plain" else int(tiles)
    return {"batch_size": batch, "dim": DIM, "path": "plain" if tiles == "plain" else "tiled",
            "tile": side, "peak_growth_bytes": growth,
            "floats_per_square": growth / (4 * side * side)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="512,1024,2048,4096,8192")
    parser.add_argument("--out", type=Path, default=Path("runs") / "bench")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return
    rows = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        load = os.getloadavg()
        out = subprocess.run([sys.executable, str(HERE), "--worker", str(batch)],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["load_before"] = load
        rows.append(row)
        print(f"B={batch}: {row['floats_per_square']:.2f} floats per square ({row['path']})",
              file=sys.stderr)
    result = {"benchmark": "CLIP loss forward + backward: peak RSS growth per (B, B) or (T, T) "
                           "float32 matrix", "rows": rows,
              "plain_floats_per_b2": max(r["floats_per_square"] for r in rows
                                         if r["path"] == "plain"),
              "tiled_floats_per_t2": max((r["floats_per_square"] for r in rows
                                          if r["path"] == "tiled"), default=None)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loss_memory.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
