"""A small, deterministic training loop for classification (and next-token LM).

``train()`` applies the recipe, then runs ``epochs`` passes of SGD/Adam with a
seeded data order, evaluating on the val split after every epoch. Mutable
progress lives in :class:`TrainState` so checkpoint/resume can be added by
saving and restoring it alongside the model and optimizer state dicts.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader

from inttrain.data import DatasetSplits

from .progress import Progress
from .recipes import apply_recipe, autocast_for

__all__ = [
    "OPTIMIZER_NAMES",
    "EpochStats",
    "TrainState",
    "RunResult",
    "NonFiniteLossError",
    "build_optimizer",
    "evaluate",
    "train",
]

OPTIMIZER_NAMES: tuple[str, ...] = ("sgd", "adam", "adamw")


@dataclass
class EpochStats:
    epoch: int  # 1-based
    train_loss: float  # mean over the epoch's finite-loss steps (nan if none)
    val_accuracy: float
    steps: int  # steps taken (excluding skipped)
    skipped: int
    seconds: float  # wall time of the epoch's training steps
    time_per_step: float  # mean seconds per step within the epoch


@dataclass
class TrainState:
    """Everything about a run's progress that a resume would need."""

    epoch: int = 0  # completed epochs
    step: int = 0  # attempted steps, skipped ones included (1-based ids)
    skipped: int = 0
    consecutive_skips: int = 0
    step_times: list[float] = field(default_factory=list)
    history: list[EpochStats] = field(default_factory=list)


@dataclass
class RunResult:
    recipe: str
    epochs: list[EpochStats]
    steps: int  # optimizer steps taken
    skipped_steps: int
    time_per_step: float  # median seconds per taken step (robust to warm-up)

    @property
    def train_losses(self) -> list[float]:
        return [e.train_loss for e in self.epochs]

    @property
    def val_accuracies(self) -> list[float]:
        return [e.val_accuracy for e in self.epochs]

    @property
    def val_accuracy(self) -> float:
        return self.epochs[-1].val_accuracy if self.epochs else float("nan")


class NonFiniteLossError(RuntimeError):
    """Too many consecutive non-finite losses; ``result`` holds the partial run."""

    def __init__(self, message: str, step: int, result: RunResult) -> None:
        super().__init__(message)
        self.step, self.result = step, result


def build_optimizer(name: str, params: Any, lr: float, momentum: float = 0.9, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZER_NAMES)}")


def _loss(logits: Tensor, target: Tensor) -> Tensor:
    # [B, T, V] language-model logits are scored per token.
    if logits.ndim == 3:
        logits, target = logits.flatten(0, 1), target.flatten()
    return F.cross_entropy(logits.float(), target)


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, recipe: str, device: torch.device) -> float:
    """Top-1 accuracy (per token for [B, T, V] outputs)."""
    was_training = model.training
    model.eval()
    correct = total = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with autocast_for(recipe, device):
            logits = model(x)
        correct += int((logits.argmax(-1) == y).sum())
        total += y.numel()
    model.train(was_training)
    return correct / max(total, 1)


def train(
    model: nn.Module,
    splits: DatasetSplits,
    recipe: str = "fp32",
    epochs: int = 5,
    batch_size: int = 32,
    lr: float = 0.05,
    optimizer: str = "sgd",
    seed: int = 0,
    device: str | torch.device = "cpu",
    log: Callable[[str], Any] = print,
    *,
    max_consecutive_skips: int = 10,
    progress: bool | None = None,
) -> RunResult:
    """Train ``model`` on ``splits`` in place and return per-epoch statistics.

    ``recipe``: "fp32", "bf16" (autocast) or any recipe of ``inttrain.prepare_``
    (applied in place before the optimizer is built). Seeded: same seed, model
    init and data give identical losses. Steps with a non-finite loss are
    skipped (no optimizer step); ``max_consecutive_skips`` in a row raise
    :class:`NonFiniteLossError`. ``progress``: tqdm bar (True), periodic lines
    (False), or decide by whether stderr is a TTY (None).
    """
    if epochs < 1 or batch_size < 1 or not lr > 0 or max_consecutive_skips < 1:
        raise ValueError(
            f"epochs, batch_size and max_consecutive_skips must be >= 1 and lr > 0; got epochs={epochs}, "
            f"batch_size={batch_size}, lr={lr}, max_consecutive_skips={max_consecutive_skips}"
        )
    dev = torch.device(device)
    torch.manual_seed(seed)  # dropout, stochastic rounding, ... inside the step
    model.to(dev)
    apply_recipe(model, recipe)
    # After prepare_: the optimizer must see the parameters the model now uses.
    opt = build_optimizer(optimizer, model.parameters(), lr)

    gen = torch.Generator().manual_seed(seed)
    # drop_last keeps every step the same shape (comparable step times, no
    # 1-sample BatchNorm batches); reshuffling means no sample is lost for good.
    train_loader = DataLoader(
        splits.train, batch_size=batch_size, shuffle=True, generator=gen, drop_last=len(splits.train) >= batch_size
    )
    val_loader = DataLoader(splits.val, batch_size=max(batch_size, 256))

    state = TrainState()

    def result() -> RunResult:
        taken = state.step_times
        return RunResult(
            recipe, list(state.history), len(taken), state.skipped, statistics.median(taken) if taken else float("nan")
        )

    for epoch in range(1, epochs + 1):
        model.train()
        losses: list[float] = []
        epoch_times: list[float] = []
        skipped_before = state.skipped
        bar = Progress(len(train_loader), f"epoch {epoch}/{epochs}", log, tty=progress)
        try:
            for i, (x, y) in enumerate(train_loader, 1):
                state.step += 1
                x, y = x.to(dev), y.to(dev)
                t0 = time.perf_counter()
                with autocast_for(recipe, dev):
                    logits = model(x)
                loss = _loss(logits, y)
                if not torch.isfinite(loss):
                    state.skipped += 1
                    state.consecutive_skips += 1
                    if state.consecutive_skips >= max_consecutive_skips:
                        first = state.step - state.consecutive_skips + 1
                        raise NonFiniteLossError(
                            f"loss was non-finite for {state.consecutive_skips} consecutive steps "
                            f"(steps {first}..{state.step}); stopped at step {state.step} (epoch {epoch}). "
                            f"Try a lower lr or a higher-precision recipe.",
                            state.step,
                            result(),
                        )
                    continue
                state.consecutive_skips = 0
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                epoch_times.append(time.perf_counter() - t0)
                losses.append(float(loss.detach()))
                bar.update(i, losses[-1])
        finally:
            bar.close()
            state.step_times += epoch_times
        stats = EpochStats(
            epoch=epoch,
            train_loss=sum(losses) / len(losses) if losses else math.nan,
            val_accuracy=evaluate(model, val_loader, recipe, dev),
            steps=len(epoch_times),
            skipped=state.skipped - skipped_before,
            seconds=sum(epoch_times),
            time_per_step=sum(epoch_times) / len(epoch_times) if epoch_times else math.nan,
        )
        state.history.append(stats)
        state.epoch = epoch
        log(
            f"epoch {epoch}/{epochs}  train_loss {stats.train_loss:.4f}  val_acc {stats.val_accuracy:.4f}  "
            f"{stats.time_per_step * 1e3:.2f} ms/step  steps {stats.steps}"
            + (f"  skipped {stats.skipped}" if stats.skipped else "")
        )
    return result()
