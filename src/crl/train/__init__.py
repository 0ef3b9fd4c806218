"""Training: the typed run config, ``fit(config, run_dir) -> RunResult`` (one run) and
``fit_group`` (runs that differ only in their negatives), the :class:`Trainer` loop both use with
a step strategy (:mod:`crl.train.steps`), checkpoints, the run directory, and re-evaluation of a
finished run.

Example:
    >>> cfg = load_config("synthetic-gaussian", ["train.steps=5"])
    >>> cfg.loss.name, cfg.train.steps
    ('info_nce', 5)
"""

from crl.losses import Objective
from crl.train.build import BuiltRun, build_run
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
from crl.train.grouped import GroupingError, fit_group, group_key
from crl.train.loading import apply_overrides, load_config, preset_names, validate_config
from crl.train.loading import smoke as smoke_config
from crl.train.loop import fit
from crl.train.sampler import epoch_permutation
from crl.train.step import NonFiniteLossError, Step
from crl.train.steps import build_step, train_step
from crl.train.trainer import RunResult, Trainer, TrainingRun
from crl.train.writer import RunWriter

__all__ = [
    "BuiltRun",
    "EvalConfig",
    "GclOptions",
    "GroupingError",
    "LossConfig",
    "NonFiniteLossError",
    "Objective",
    "OceOptions",
    "OptimConfig",
    "RunResult",
    "RunWriter",
    "Step",
    "TrainConfig",
    "TrainOptions",
    "Trainer",
    "TrainingRun",
    "apply_overrides",
    "build_run",
    "build_step",
    "config_hash",
    "epoch_permutation",
    "evaluate_run",
    "fit",
    "fit_group",
    "group_key",
    "load_checkpoint",
    "load_config",
    "preset_names",
    "save_checkpoint",
    "smoke_config",
    "train_step",
    "validate_config",
]
