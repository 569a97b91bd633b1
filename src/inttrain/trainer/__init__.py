"""Training: ``train(model, splits, recipe, ...)`` -> :class:`RunResult`."""

from __future__ import annotations

from .loop import (
    OPTIMIZER_NAMES,
    EpochStats,
    NonFiniteLossError,
    RunResult,
    TrainHooks,
    TrainOptions,
    Trainer,
    TrainState,
    build_optimizer,
    evaluate,
    evaluate_metrics,
    train,
)
from .callbacks import Callback
from .step import StepOutcome, train_step
from .checkpoint import CheckpointError, checkpoint_paths, load_checkpoint, save_checkpoint
from .recipes import apply_recipe

__all__ = [
    "OPTIMIZER_NAMES",
    "EpochStats",
    "NonFiniteLossError",
    "RunResult",
    "TrainHooks",
    "TrainState",
    "TrainOptions",
    "Trainer",
    "Callback",
    "StepOutcome",
    "train_step",
    "CheckpointError",
    "checkpoint_paths",
    "load_checkpoint",
    "save_checkpoint",
    "apply_recipe",
    "build_optimizer",
    "evaluate",
    "evaluate_metrics",
    "train",
]
