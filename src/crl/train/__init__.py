"""Training: the typed run config, ``fit(config, run_dir) -> RunResult``, checkpoints, the run
directory, and re-evaluation of a finished run.

Example:
    >>> cfg = load_config("synthetic-gaussian", ["train.steps=5"])
    >>> cfg.loss.name, cfg.train.steps
    ('info_nce', 5)
"""

from crl.train.checkpoint import load_checkpoint, save_checkpoint
from crl.train.config import (
    EvalConfig,
    GclOptions,
    LossConfig,
    OceOptions,
    OptimConfig,
    TrainConfig,
    TrainOptions,
    apply_overrides,
    config_hash,
    load_config,
    preset_names,
    validate_config,
)
from crl.train.config import smoke as smoke_config
from crl.train.loop import (
    NonFiniteLossError,
    RunResult,
    build_run,
    epoch_permutation,
    evaluate_run,
    fit,
    train_step,
)
from crl.train.objective import Objective

__all__ = [
    "EvalConfig",
    "GclOptions",
    "LossConfig",
    "NonFiniteLossError",
    "Objective",
    "OceOptions",
    "OptimConfig",
    "RunResult",
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
