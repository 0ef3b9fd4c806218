"""A study's ``fit`` runs: training one (starting over what another crl left half done) and
reading a finished one back with its trained weights."""

from __future__ import annotations

from pathlib import Path

import torch

from crl.errors import StaleRunError
from crl.rundir import CHECKPOINT_FILE, CONFIG_FILE, METRICS_FILE, SUMMARY_FILE
from crl.train import (
    BuiltRun,
    RunResult,
    TrainConfig,
    build_run,
    config_hash,
    fit,
    load_checkpoint,
)

# What ``fit`` writes in its run directory (a study's own files there are left alone).
_FIT_FILES = (SUMMARY_FILE, CHECKPOINT_FILE, METRICS_FILE, CONFIG_FILE)


def fit_study_run(config: TrainConfig, run_dir: Path, *, resume: bool) -> RunResult:
    """``fit(config, run_dir, resume=resume)`` for one run of a study, without a progress bar.

    A study names its runs by the hash of the options it sets, while a checkpoint belongs to the
    resolved config (every default filled in) and its crl version. When the directory holds
    work of another resolved config or version (a study started by an earlier crl whose config
    had fewer fields, then resumed by this one), that work cannot be continued and is not this
    crl's result: the run starts over rather than mixing two versions in one run.
    A finished study run is never redone (the runner checks its ``summary.json`` first).

    Raises:
        CrlError: as :func:`crl.train.fit`, except for the stale work above.
    """
    try:
        return fit(config, run_dir, resume=resume, progress=False)
    except StaleRunError:
        for name in _FIT_FILES:
            (run_dir / name).unlink(missing_ok=True)
        return fit(config, run_dir, progress=False)


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
