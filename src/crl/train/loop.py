"""``fit(config, run_dir)``: train a dual encoder, evaluate it, and write the run directory.

The pieces, each in its own module: what a run is made of (:mod:`crl.train.build`), the batch
order of an epoch (:mod:`crl.train.sampler`), the step strategy (:mod:`crl.train.steps`), the
loop (:mod:`crl.train.trainer`), the metrics (:mod:`crl.train.evaluation`) and everything
written to disk, on rank 0 only (:mod:`crl.train.writer`). :func:`fit` opens the run directory
and hands one run to the :class:`~crl.train.trainer.Trainer`.

Determinism and resume: the data order of epoch ``e`` depends only on ``(seed, e)``,
augmentations are seeded by ``(seed, epoch, index)`` inside the data set, and a checkpoint stores
the step (hence the epoch and the position in it), the model, objective, optimiser, scheduler and
RNG states. A resumed run skips the batches of the epoch that were consumed and continues bit for
bit like an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path

import torch

from crl import distributed
from crl.errors import CrlValueError
from crl.train.config import TrainConfig, config_hash
from crl.train.steps import build_step
from crl.train.trainer import RunResult, Trainer, TrainingRun, open_run
from crl.train.writer import RunWriter


def fit(config: TrainConfig, run_dir: str | Path, *, resume: bool = False,
        progress: bool = True, tensorboard: bool = False,
        stop_at: int | None = None) -> RunResult:
    """Train, evaluate and write the run directory (``config.json``, ``metrics.jsonl``,
    ``checkpoint.pt``, then ``summary.json`` last).

    Under torchrun (``WORLD_SIZE`` set), it joins the process group if the caller has not.

    Args:
        config: The run config.
        run_dir: The run directory (created if needed).
        resume: Continue from ``checkpoint.pt`` (a finished run is returned as is).
        progress: Show a progress bar (only on a terminal).
        tensorboard: Also write TensorBoard event files (needs ``tensorboard``).
        stop_at: Stop after this global step, with a checkpoint and without a summary (for
            preemptible jobs); ``fit(..., resume=True)`` continues it.

    Returns:
        A :class:`~crl.train.resume.RunResult`.

    Raises:
        CrlError: on a non-empty run directory without ``resume``, a corrupt checkpoint, or a
            non-finite loss (naming the step and the last good checkpoint).
        StaleRunError: on resuming a checkpoint or finished run of another config or crl
            version.
    """
    run_dir = Path(run_dir)
    run_id = config_hash(config)
    if config.train.device.startswith("cuda") and not torch.cuda.is_available():
        raise CrlValueError(f"train.device is {config.train.device!r} but CUDA is not available "
                            "on this machine; use --device cpu")
    distributed.init_from_env(config.train.device)  # a no-op when already joined (the CLI)
    distributed.local_batch_size(config.train.batch_size, distributed.world_size())
    # rank 0 reads the run directory for everyone
    done, checkpoint = distributed.run_on_main(lambda: open_run(run_dir, run_id, resume))
    if done is not None:
        return done
    device = distributed.device_for(config.train.device)
    threads = torch.get_num_threads()
    if config.train.num_threads is not None:
        torch.set_num_threads(config.train.num_threads)
    try:
        with RunWriter(run_dir, tensorboard=tensorboard) as writer:
            run = TrainingRun.start(config, writer, device, checkpoint=checkpoint)
            step = build_step(config.train.micro_batch_size, config.train.precision,
                              config.train.micro_batch_tokens)
            [result] = Trainer([run], step).train(stop_at, progress=progress)
            return result
    finally:
        torch.set_num_threads(threads)


__all__ = ["RunResult", "fit"]
