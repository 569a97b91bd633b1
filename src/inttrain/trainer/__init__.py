"""Training: ``train(model, splits, recipe, ...)`` -> :class:`RunResult`."""

from __future__ import annotations

from .loop import (
    OPTIMIZER_NAMES,
    EpochStats,
    NonFiniteLossError,
    RunResult,
    TrainState,
    build_optimizer,
    evaluate,
    train,
)
from .recipes import FLOAT_RECIPES, apply_recipe, get_prepare

__all__ = [
    "OPTIMIZER_NAMES",
    "FLOAT_RECIPES",
    "EpochStats",
    "NonFiniteLossError",
    "RunResult",
    "TrainState",
    "apply_recipe",
    "build_optimizer",
    "evaluate",
    "get_prepare",
    "train",
]
