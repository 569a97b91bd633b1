"""Shared by the trainer tests: a seeded small-cnn and hooks that record what the loop reports."""

from __future__ import annotations

from typing import Any

import torch

from inttrain.data import DatasetSplits
from inttrain.models import build_model
from inttrain.trainer import TrainHooks


class Record(TrainHooks):
    """Per-step (loss, lr) and the latest "last" snapshot (the one a stop or an epoch end writes)."""

    def __init__(self) -> None:
        self.steps: list[tuple[float | None, float]] = []
        self.last: Any = None

    def on_step(self, state: Any, loss: float | None, lr: float, seconds: float) -> None:
        self.steps.append((loss, lr))

    def save(self, name: str, snapshot: Any) -> None:
        if name == "last":
            self.last = snapshot()


def small_cnn(splits: DatasetSplits) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("small-cnn", splits.num_classes, splits.in_channels, splits.image_size)
