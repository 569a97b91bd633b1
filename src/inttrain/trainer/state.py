"""The state a training run keeps and reports: progress (:class:`TrainState`), per-epoch statistics,
the run's result, and the hooks a caller (the CLI's run folder) plugs into the loop."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import Tensor

__all__ = ["perplexity", "EpochStats", "TrainState", "RunResult", "NonFiniteLossError", "TrainHooks"]


def perplexity(loss: float) -> float:
    """exp(loss), inf where that overflows."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


@dataclass
class EpochStats:
    epoch: int  # 1-based
    train_loss: float  # mean over the epoch's finite-loss steps (nan if none)
    val_accuracy: float
    steps: int  # steps taken (excluding skipped)
    skipped: int
    seconds: float  # wall time of the epoch's training steps
    time_per_step: float  # mean seconds per step within the epoch
    # Mean cross-entropy on the val split (per token for language models); a
    # default so checkpoints written before it existed still load.
    val_loss: float = math.nan

    @property
    def val_perplexity(self) -> float:
        """exp(val_loss): the language-model figure (inf if the loss overflows it)."""
        return perplexity(self.val_loss)


@dataclass
class TrainState:
    """Everything about a run's progress that a resume would need (see :meth:`to_dict`)."""

    epoch: int = 0  # completed epochs
    step: int = 0  # attempted steps, skipped ones included (1-based ids)
    skipped: int = 0
    consecutive_skips: int = 0
    position: int = 0  # batches of the current epoch already consumed
    # Data-order generator state at the start of the current epoch: the epoch's
    # permutation is redrawn from it on a mid-epoch resume.
    epoch_gen_state: Tensor | None = None
    epoch_losses: list[float] = field(default_factory=list)  # current epoch so far
    epoch_times: list[float] = field(default_factory=list)
    epoch_skipped: int = 0
    best_val_accuracy: float = -math.inf
    best_val_loss: float = math.inf
    step_times: list[float] = field(default_factory=list)
    history: list[EpochStats] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain containers only (``torch.load(weights_only=True)`` compatible)."""
        d = {k: v for k, v in vars(self).items() if k != "history"}
        d["history"] = [asdict(h) for h in self.history]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainState:
        d = dict(d)
        history = [EpochStats(**h) for h in d.pop("history", [])]
        return cls(**d, history=history)


@dataclass
class RunResult:
    recipe: str
    epochs: list[EpochStats]
    steps: int  # optimizer steps taken
    skipped_steps: int
    time_per_step: float  # median seconds per taken step (robust to warm-up)
    stopped: str = ""  # why training ended before its last epoch ("" if it did not)
    # (val_loss, val_accuracy) of the validation a max_steps stop ends with (None: the run ended at an epoch).
    final_val: tuple[float, float] | None = None

    @property
    def train_losses(self) -> list[float]:
        return [e.train_loss for e in self.epochs]

    @property
    def val_accuracies(self) -> list[float]:
        return [e.val_accuracy for e in self.epochs]

    @property
    def val_accuracy(self) -> float:
        """Accuracy of the last validation (the final one of a max_steps stop, else the last epoch's)."""
        if self.final_val is not None:
            return self.final_val[1]
        return self.epochs[-1].val_accuracy if self.epochs else float("nan")

    @property
    def val_loss(self) -> float:
        if self.final_val is not None:
            return self.final_val[0]
        return self.epochs[-1].val_loss if self.epochs else float("nan")

    @property
    def val_perplexity(self) -> float:
        """exp(val_loss) of the last validation (inf if it overflows)."""
        return perplexity(self.val_loss)


class NonFiniteLossError(RuntimeError):
    """Too many consecutive non-finite losses; ``result`` holds the partial run."""

    def __init__(self, message: str, step: int, result: RunResult) -> None:
        super().__init__(message)
        self.step, self.result = step, result


class TrainHooks:
    """What a caller (the CLI's run folder) can plug into :func:`train`; every method is a no-op here."""

    def on_step(self, state: TrainState, loss: float | None, lr: float, seconds: float) -> None:
        """After every attempted step; ``loss`` is None for a skipped step."""

    def on_epoch(self, state: TrainState, stats: EpochStats, lr: float) -> None:
        """After each epoch's evaluation."""

    def save(self, name: str, snapshot: Callable[[], tuple[dict[str, Tensor], dict[str, Any]]]) -> None:
        """Checkpoint ``name`` ("last" or "best") is due; ``snapshot()`` gives (weights, state)."""

    def should_stop(self) -> bool:
        """Polled after every step (e.g. a signal arrived): stop after saving ``last``."""
        return False
