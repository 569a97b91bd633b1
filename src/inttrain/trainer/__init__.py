"""Training: ``train(model, splits, recipe, ...)`` -> :class:`RunResult`."""

from __future__ import annotations

from .loop import (
    OPTIMIZER_NAMES,
    EpochStats,
    NonFiniteLossError,
    RunResult,
    TrainHooks,
    TrainState,
    build_optimizer,
    evaluate,
    evaluate_metrics,
    train,
)
from .checkpoint import CheckpointError, checkpoint_paths, load_checkpoint, save_checkpoint
from .recipes import FLOAT_RECIPES, apply_recipe

__all__ = [
    "OPTIMIZER_NAMES",
    "FLOAT_RECIPES",
    "EpochStats",
    "NonFiniteLossError",
    "RunResult",
    "TrainHooks",
    "TrainState",
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
