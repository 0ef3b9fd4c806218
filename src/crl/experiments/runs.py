"""Reading a finished ``fit`` run back: its data, model and objective with the trained weights."""

from __future__ import annotations

from pathlib import Path

import torch

from crl.train import TrainConfig, config_hash, load_checkpoint
from crl.train.loop import BuiltRun, build_run


def load_trained(train_dir: Path, config: TrainConfig) -> BuiltRun:
    """The run of ``config`` in ``train_dir`` with the weights of its last checkpoint (on CPU).

    Raises:
        CrlError: if the checkpoint is missing, corrupt or belongs to another config.
    """
    state = load_checkpoint(train_dir / "checkpoint.pt", config_hash=config_hash(config))
    built = build_run(config, torch.device("cpu"))
    built.model.load_state_dict(state["model"])
    built.model.eval()
    return built
