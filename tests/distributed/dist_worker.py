"""Run under torchrun by tests/distributed/test_distributed_training.py (not a test module).

``python -m torch.distributed.run --nproc_per_node 2 ... dist_worker.py CONFIG_DIR OUT_DIR``:

1. ``gather/rank<r>.pt``: the gradient that :func:`crl.distributed.all_gather_with_grad`
   gives each rank's input when every rank has its own loss of the gathered tensor.
2. For every ``CONFIG_DIR/<loss>.yaml``: ``fit`` into ``OUT_DIR/<loss>-<config hash>``.
3. For ``CONFIG_DIR/resume.yaml``: ``fit(..., stop_at=STOP)`` only (the test resumes it with
   ``crl train --nproc 2 --resume``).
4. ``odd_error.txt``: the error of ``fit`` on ``CONFIG_DIR/odd/odd.yaml``, whose global batch is
   not divisible by the number of processes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from crl import distributed
from crl.errors import CrlValueError
from crl.train import config_hash, fit, load_config

#: The step the resume run stops at.
STOP = 3


def gather_case(rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global input ``(world * 3, 4)`` and rank ``rank``'s loss weights ``(world * 3, 4)``."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(world * 3, 4, generator=g, dtype=torch.float64)
    weights = torch.randn(world, world * 3, 4, generator=g, dtype=torch.float64)
    return x, weights[rank]


def rank_loss(y: torch.Tensor, weights: torch.Tensor, rank: int) -> torch.Tensor:
    """A different, non-separable loss of the gathered ``y`` on every rank."""
    return (weights * y).sum() + (rank + 1) * torch.logsumexp(y @ y.T, dim=1).sum()


def main() -> None:
    config_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    distributed.init_from_env("cpu")
    try:
        rank, world = distributed.rank(), distributed.world_size()
        x, weights = gather_case(rank, world)
        local = x[rank * 3:(rank + 1) * 3].clone().requires_grad_(True)
        gathered = distributed.all_gather_with_grad(local)
        rank_loss(gathered, weights, rank).backward()
        assert local.grad is not None
        if distributed.is_main():
            (out_dir / "gather").mkdir(parents=True, exist_ok=True)
        distributed.barrier()
        torch.save({"gathered": gathered.detach(), "grad": local.grad},
                   out_dir / "gather" / f"rank{rank}.pt")
        for path in sorted(config_dir.glob("*.yaml")):
            cfg = load_config(path)
            run_dir = out_dir / f"{path.stem}-{config_hash(cfg)}"
            fit(cfg, run_dir, progress=False, stop_at=STOP if path.stem == "resume" else None)
        try:
            fit(load_config(config_dir / "odd" / "odd.yaml"), out_dir / "odd", progress=False)
        except CrlValueError as exc:
            (out_dir / f"odd_error{rank}.txt").write_text(str(exc))
    except BaseException:
        distributed.shutdown(wait=False)
        raise
    distributed.shutdown()
    distributed.finish(0)  # as `crl train` does under torchrun


if __name__ == "__main__":
    main()
