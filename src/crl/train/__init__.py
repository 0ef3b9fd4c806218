"""Training: the typed run config, ``fit(config, run_dir) -> RunResult``, checkpoints, the run
directory, and re-evaluation of a finished run.

Example:
    >>> cfg = load_config("synthetic-gaussian", ["train.steps=5"])
    >>> cfg.loss.name, cfg.train.steps
    ('info_nce', 5)
"""

from crl.losses import Objective
from crl.train.build import build_run
from crl.train.checkpoint import load_checkpoint, save_checkpoint
from crl.train.config import (
    EvalConfig,
    GclOptions,
    LossConfig,
    OceOptions,
    OptimConfig,
    TrainConfig,
    TrainOptions,
    config_hash,
)
from crl.train.evaluation import evaluate_run
from crl.train.loading import apply_overrides, load_config, preset_names, validate_config
from crl.train.loading import smoke as smoke_config
from crl.train.loop import RunResult, fit
from crl.train.sampler import epoch_permutation
from crl.train.step import NonFiniteLossError, train_step
from crl.train.writer import RunWriter

__all__ = [
    "EvalConfig",
    "GclOptions",
    "LossConfig",
    "NonFiniteLossError",
    "Objective",
    "OceOptions",
    "OptimConfig",
    "RunResult",
    "RunWriter",
    "TrainConfig",
    "TrainOptions",
    "apply_overrides",
    "build_run",
    "config_hash",
    "epoch_permutation",
    "evaluate_run",
    "fit",
    "load_checkpoint",
    "load_config",
    "preset_names",
    "save_checkpoint",
    "smoke_config",
    "train_step",
    "validate_config",
]
