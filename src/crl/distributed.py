"""Data-parallel training on ``torch.distributed`` (gloo on CPU, NCCL on GPU).

``torchrun --nproc_per_node=N -m crl train CONFIG`` (or ``crl train --nproc N CONFIG``) starts
``N`` processes; :func:`crl.train.fit` then splits each global batch into ``N`` equal contiguous
slices, one per rank, all-gathers the features with gradient (:func:`all_gather_with_grad`) and
each rank scores its own rows (:func:`own_rows`) against all gathered columns, returning ``N``
times its share of the global loss, so that the ranks' values average to it. The gradient that
reaches a rank's features is the sum over ranks (``N`` times the gradient of the global loss), so
averaging the parameter gradients over ranks (:func:`average_gradients`) gives exactly the
one-process gradient of the global batch. See ``docs/distributed.md``.

Outside a process group every function here is the one-process identity: ``rank() == 0``,
``world_size() == 1``, :func:`all_gather_with_grad` returns its input.

Example:
    >>> rank(), world_size(), is_main(), is_active()
    (0, 1, True, False)
    >>> x = torch.ones(3, 2)
    >>> all_gather_with_grad(x) is x
    True
    >>> local_batch_size(8, 2)
    4
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from crl.errors import CrlError, CrlValueError

T = TypeVar("T")


def is_active() -> bool:
    """True inside an initialised ``torch.distributed`` process group."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank (0 outside a process group)."""
    return dist.get_rank() if is_active() else 0


def world_size() -> int:
    """The number of processes (1 outside a process group)."""
    return dist.get_world_size() if is_active() else 1


def local_rank() -> int:
    """The rank on this machine (``LOCAL_RANK`` set by torchrun; 0 otherwise)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """True on rank 0, the process that writes the run directory."""
    return rank() == 0


def backend_for(device: str) -> str:
    """The process-group backend for a device: ``"nccl"`` for CUDA, ``"gloo"`` otherwise.

    Example:
        >>> backend_for("cpu"), backend_for("cuda"), backend_for("cuda:1")
        ('gloo', 'nccl', 'nccl')
    """
    return "nccl" if device.startswith("cuda") else "gloo"


def init_from_env(device: str = "cpu") -> bool:
    """Join the process group described by torchrun's environment, if there is one.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. Does
    nothing (and returns False) without ``WORLD_SIZE`` or with ``WORLD_SIZE=1``; returns True
    when a process group is (already or now) initialised. On CUDA the process uses GPU
    ``LOCAL_RANK``.

    Args:
        device: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL).

    Raises:
        CrlValueError: if ``WORLD_SIZE`` or ``RANK`` is not an integer.
    """
    if is_active():
        return True
    raw = os.environ.get("WORLD_SIZE")
    if raw is None:
        return False
    try:
        size, _ = int(raw), int(os.environ.get("RANK", "0"))
    except ValueError:
        raise CrlValueError(
            "init_from_env: WORLD_SIZE and RANK must be integers (set by torchrun); got "
            f"WORLD_SIZE={raw!r}, RANK={os.environ.get('RANK')!r}") from None
    if size <= 1:
        return False
    backend = backend_for(device)
    if backend == "nccl":
        torch.cuda.set_device(local_rank())
    dist.init_process_group(backend=backend, init_method="env://")
    return True


def device_for(device: str) -> torch.device:
    """The device of this rank: ``cuda`` becomes ``cuda:LOCAL_RANK`` in a process group.

    Example:
        >>> device_for("cpu")
        device(type='cpu')
    """
    if device == "cuda" and is_active():
        return torch.device("cuda", local_rank())
    return torch.device(device)


def barrier() -> None:
    """Wait for every rank (no-op outside a process group)."""
    if is_active():
        dist.barrier()


def shutdown(*, wait: bool = True) -> None:
    """Leave the process group cleanly: a barrier, then ``destroy_process_group()``.

    Call it once at the end of every rank (the CLI does); a process that exits with a live gloo
    group can abort at interpreter exit.

    Args:
        wait: Meet the other ranks at a barrier first (False after an error on this rank, whose
            peers may never get there; torchrun then stops them).
    """
    if is_active():
        if wait:
            dist.barrier()
        dist.destroy_process_group()


def finish(code: int = 0) -> NoReturn:
    """End a torchrun rank's process after :func:`shutdown`: flush stdout and stderr, then
    ``os._exit(code)``.

    Interpreter finalisation is skipped on purpose: on a loaded machine a gloo rank sometimes
    aborted there ("terminate called without an active exception", exit -6, in 2 of 30
    two-process runs of ``crl train`` on 2 busy cores) after every step, file and barrier was
    done, since C++ threads left behind by the process group are torn down with the
    interpreter. Call it only when all work is written: crl's run files are closed after every
    write, so nothing is lost. The CLI calls it at the end of ``crl train`` under torchrun.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: nothing left to save
            pass
    os._exit(code)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def launch_command(nproc: int, args: Sequence[str], *, port: int | None = None) -> list[str]:
    """The torchrun command line that runs ``crl <args>`` in ``nproc`` processes on this machine.

    Example:
        >>> launch_command(2, ["train", "cfg.yaml"], port=29500)[3:]
        ['--nproc_per_node', '2', '--master_addr', '127.0.0.1', '--master_port', '29500', \
'-m', 'crl', 'train', 'cfg.yaml']
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise CrlValueError(f"--nproc must be an integer >= 1; got {nproc!r}")
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(port or free_port()),
            "-m", "crl", *args]


def launch(nproc: int, args: Sequence[str]) -> int:
    """Run ``crl <args>`` under torchrun with ``nproc`` local processes; its exit code."""
    return subprocess.call(launch_command(nproc, args))


def local_batch_size(batch_size: int, world: int) -> int:
    """The per-rank batch of a global ``batch_size`` split over ``world`` ranks.

    Raises:
        CrlValueError: if ``batch_size`` is not divisible by ``world``.

    Example:
        >>> local_batch_size(12, 3)
        4
    """
    if world < 1 or batch_size % world:
        raise CrlValueError(
            f"train.batch_size (the global batch) must be divisible by the number of processes "
            f"{world}; got {batch_size} (use a multiple of {world}, e.g. "
            f"{max(world, batch_size - batch_size % world)})")
    return batch_size // world


def shard(batch: Sequence[T], rank_: int | None = None, world: int | None = None) -> list[T]:
    """This rank's contiguous slice of a global batch: ``batch[r*b:(r+1)*b]``, ``b = B / world``.

    Gathering the slices of all ranks in rank order gives back ``batch`` in order.

    Example:
        >>> shard([10, 11, 12, 13], 1, 2)
        [12, 13]
    """
    return list(batch[own_rows(len(batch), rank_, world)])


class GatherWithGrad(torch.autograd.Function):
    """``all_gather`` along dim 0 with a gradient.

    Forward: ``(B, ...)`` on each rank -> ``(world * B, ...)``, the ranks' tensors in rank order.
    Backward: the incoming ``(world * B, ...)`` gradients are summed over ranks (all-reduce) and
    each rank gets its own ``(B, ...)`` slice, i.e. the gradient of the sum of the ranks' losses
    with respect to its input.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.batch = x.shape[0]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        total = grad.contiguous().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        start = dist.get_rank() * ctx.batch
        return total[start:start + ctx.batch]


def all_gather_with_grad(x: Tensor) -> Tensor:
    """Concatenate ``x (B, ...)`` of every rank in rank order: ``(world * B, ...)``, with a
    gradient (see :class:`GatherWithGrad`). Every rank must pass the same shape. Outside a
    process group: ``x`` itself.
    """
    if not is_active() or world_size() == 1:
        return x
    out: Tensor = GatherWithGrad.apply(x)  # type: ignore[no-untyped-call]
    return out


def all_gather_tensor(x: Tensor) -> Tensor:
    """Concatenate ``x (B, ...)`` of every rank in rank order without a gradient (indices,
    labels). Outside a process group: ``x`` itself."""
    if not is_active() or world_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=0)


def all_reduce_sum(x: Tensor) -> Tensor:
    """The sum of ``x`` over ranks, a new tensor without a gradient (counts, logged values).
    Outside a process group: a copy of ``x``.

    Example:
        >>> all_reduce_sum(torch.tensor([3, 4])).tolist()
        [3, 4]
    """
    out = x.detach().clone()
    if is_active() and world_size() > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def own_rows(batch: int, rank_: int | None = None, world: int | None = None) -> slice:
    """The rows of rank ``rank_`` in a gathered batch of ``batch`` rows (rank order, equal
    slices): ``slice(r * b, (r + 1) * b)``, ``b = batch / world``.

    Example:
        >>> own_rows(8, 1, 2)
        slice(4, 8, None)
    """
    r = rank() if rank_ is None else rank_
    w = world_size() if world is None else world
    b = local_batch_size(batch, w)
    return slice(r * b, (r + 1) * b)


def average_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Replace each parameter's gradient by its mean over ranks (one flat all-reduce).

    Parameters without a gradient are skipped; every rank runs the same graph, so they are the
    same parameters on every rank. No-op outside a process group.
    """
    if not is_active() or world_size() == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world_size()
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n


def broadcast_object(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (pickled; no-op outside a process group)."""
    if not is_active() or world_size() == 1:
        return obj
    box: list[Any] = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0)
    out: T = box[0]
    return out


def run_on_main(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 only and give its result to every rank.

    A :class:`~crl.errors.CrlError` raised by ``fn`` on rank 0 is raised again on every rank
    (same type when it can be rebuilt from its message), so no rank waits for the others forever.

    Example:
        >>> run_on_main(lambda: 3)
        3
    """
    if not is_active() or world_size() == 1:
        return fn()
    result: Any = None
    error: tuple[type[CrlError], str] | None = None
    if is_main():
        try:
            result = fn()
        except CrlError as exc:
            error = (type(exc), str(exc))
    result, error = broadcast_object((result, error))
    if error is not None:
        kind, message = error
        try:
            rebuilt: CrlError = kind(message)
        except TypeError:
            rebuilt = CrlError(message)
        raise rebuilt
    out: T = result
    return out


__all__ = [
    "GatherWithGrad",
    "all_gather_tensor",
    "all_gather_with_grad",
    "all_reduce_sum",
    "average_gradients",
    "backend_for",
    "barrier",
    "broadcast_object",
    "device_for",
    "finish",
    "free_port",
    "init_from_env",
    "is_active",
    "is_main",
    "launch",
    "launch_command",
    "local_batch_size",
    "local_rank",
    "own_rows",
    "rank",
    "run_on_main",
    "shard",
    "shutdown",
    "world_size",
]
