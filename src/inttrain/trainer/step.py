"""One training step, and where a batch comes from on one process or on many.

:func:`train_step` is the whole step: forward under the recipe's autocast, loss, backward, the recipe's
step hook and ``optimizer.step()``.  A step whose loss or gradient is not finite is skipped: gradients
dropped, BatchNorm buffers put back, optimizer untouched (as PyTorch's GradScaler does).

Data parallelism changes three things only, so they live behind one small interface
(:class:`LocalComm` / :class:`DataParallelComm`): which rows of the global batch this process trains on,
the loss that is reported (the global mean), and whether a gradient problem on any rank skips the step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset, TensorDataset

from inttrain.recipes.base import no_step_hook

from .augment import augment_batch

__all__ = ["StepOutcome", "train_step", "loss_fn", "LocalComm", "DataParallelComm", "first_nonfinite_grad"]


@dataclass
class StepOutcome:
    loss: float | None  # the (global) training loss; None: the step was skipped
    problem: str | None  # why it was skipped
    seconds: float


def loss_fn(logits: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy; [B, T, V] language-model logits are scored per token."""
    if logits.ndim == 3:
        logits, target = logits.flatten(0, 1), target.flatten()
    return F.cross_entropy(logits.float(), target)


def first_nonfinite_grad(model: nn.Module) -> str | None:
    """Name of the first parameter (in ``named_parameters`` order) whose gradient is not finite."""
    named = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    if not named:
        return None
    # One fused reduction in the common all-finite case; the per-tensor scan runs only on failure.
    norms = torch._foreach_norm([g for _, g in named])
    if bool(torch.isfinite(torch.stack([n.float() for n in norms])).all()):
        return None
    return next((n for n, g in named if not bool(torch.isfinite(g).all())), None)


def _gather(dataset: Dataset, idx: Tensor) -> tuple[Tensor, Tensor]:
    if isinstance(dataset, TensorDataset):  # one gather per tensor instead of per-sample collation
        x, y = dataset[idx]
        return x, y
    from torch.utils.data import default_collate

    return default_collate([dataset[int(i)] for i in idx])


class LocalComm:
    """One process: the whole batch, the local loss."""

    def batch(self, dataset: Dataset, idx: Tensor, augment: str, seed: int, step: int) -> tuple[Tensor, Tensor]:
        x, y = _gather(dataset, idx)
        return augment_batch(x, augment, seed, step), y

    def mean(self, loss: Tensor) -> float:
        return float(loss.detach())

    def grad_problem(self, model: nn.Module) -> str | None:
        bad = first_nonfinite_grad(model)
        return None if bad is None else f"non-finite gradient in {bad!r}"

    def any(self, flag: bool) -> bool:
        return flag


class DataParallelComm(LocalComm):
    """This rank's share of each global batch (:class:`inttrain.distributed.data_parallel.DataParallel`)."""

    def __init__(self, dp: Any) -> None:
        self.dp = dp

    def batch(self, dataset: Dataset, idx: Tensor, augment: str, seed: int, step: int) -> tuple[Tensor, Tensor]:
        if augment == "none":
            return _gather(dataset, self.dp.shard(idx))
        # Augmentation draws per global batch: augment it whole, then take the shard.
        x, y = super().batch(dataset, idx, augment, seed, step)
        keep = self.dp.shard(torch.arange(len(idx)))
        return x[keep], y[keep]

    def mean(self, loss: Tensor) -> float:
        return self.dp.mean(loss)  # one all-reduce; non-finite on all ranks if on any

    def grad_problem(self, model: nn.Module) -> str | None:
        return None if self.dp.grads_finite(model) else "non-finite gradient (on some rank)"

    def any(self, flag: bool) -> bool:
        return self.dp.any(flag)


def train_step(net: Callable[[Tensor], Tensor], model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: tuple[Tensor, Tensor], recipe: Any, device: torch.device, *,
               before_step: Callable[[], None] = no_step_hook, clip_grad_norm: float | None = None,
               comm: LocalComm | None = None) -> StepOutcome:
    """Forward, loss, backward and one optimizer step of ``model`` (``net``: how to call it, e.g. compiled or DDP).

    ``recipe``: the :class:`~inttrain.recipes.RecipeConfig` (its autocast); ``before_step``: its step hook
    (e.g. DCLR); ``clip_grad_norm``: bound on the global gradient L2 norm.
    """
    comm = comm or LocalComm()
    x, y = batch
    t0 = time.perf_counter()
    # BatchNorm statistics change in the forward; a skipped step must not keep them.
    buffers = [t.clone() for t in model.buffers()]
    with recipe.autocast(device):
        logits = net(x)
    loss = loss_fn(logits, y)
    loss_value = comm.mean(loss)
    if not math.isfinite(loss_value):
        problem: str | None = f"non-finite loss ({loss_value})"
    else:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        problem = comm.grad_problem(model)
    if problem is not None:
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for t, saved in zip(model.buffers(), buffers):
                t.copy_(saved)
        return StepOutcome(None, problem, time.perf_counter() - t0)
    if clip_grad_norm is not None:
        # After DDP's all-reduce: every rank clips the same global gradient alike.
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
    before_step()
    optimizer.step()
    return StepOutcome(loss_value, None, time.perf_counter() - t0)
