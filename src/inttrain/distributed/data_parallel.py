"""Data-parallel training for :func:`inttrain.trainer.train` (``inttrain train --nproc N`` / torchrun).

:class:`DataParallel` is what the training loop needs from ``torch.distributed``: wrap the model in
DDP with the chosen gradient communication (``fp32`` all-reduce or the ``int8`` hook), take this
rank's shard of each global batch, average the loss across ranks, and agree on skip/stop flags so
every rank takes (or skips) the same steps.

The global batch is the configured ``batch_size``; rank ``r`` of ``W`` takes rows
``[r * batch_size / W, (r + 1) * batch_size / W)`` of it, so with the same seed the data order,
the steps per epoch and the checkpoints are those of a single-process run with the same batch size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["COMM_MODES", "DataParallel", "env_rank", "init_from_env"]

COMM_MODES: tuple[str, ...] = ("fp32", "int8")


def env_rank() -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) from torchrun-style environment variables, or None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def init_from_env(timeout_s: float, backend: str = "gloo") -> tuple[int, int]:
    """``init_process_group`` from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; returns (rank, world)."""
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


@dataclass
class DataParallel:
    """One rank's view of a data-parallel run (the process group must already be initialized)."""

    comm: str = "fp32"
    seed: int = 0
    process_group: Any = None
    hook_state: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.comm not in COMM_MODES:
            raise ValueError(f"comm must be one of {', '.join(COMM_MODES)}; got {self.comm!r}")
        self.rank = dist.get_rank(self.process_group)
        self.world = dist.get_world_size(self.process_group)

    def wrap(self, model: nn.Module) -> nn.Module:
        """DDP around ``model`` (parameters broadcast from rank 0) with the chosen comm hook."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        from .hooks import FP32HookState, Int8HookState, fp32_allreduce_hook, int8_allreduce_hook

        ddp = DDP(model, process_group=self.process_group)
        if self.comm == "int8":
            self.hook_state = Int8HookState(process_group=self.process_group, seed=self.seed)
            ddp.register_comm_hook(self.hook_state, int8_allreduce_hook)
        else:
            self.hook_state = FP32HookState(process_group=self.process_group)
            ddp.register_comm_hook(self.hook_state, fp32_allreduce_hook)
        return ddp

    def check_batch(self, batch_size: int) -> None:
        if batch_size % self.world:
            raise ValueError(f"batch_size {batch_size} (the global batch) must be divisible by the "
                             f"{self.world} processes")

    def shard(self, idx: Tensor) -> Tensor:
        """This rank's rows of the global batch ``idx`` (contiguous, equal-sized)."""
        local = idx.shape[0] // self.world
        return idx[self.rank * local:(self.rank + 1) * local]

    def mean(self, value: Tensor) -> float:
        """Mean of a scalar over ranks (non-finite on every rank if it is on any)."""
        t = value.detach().float().reshape(1).cpu().clone()
        dist.all_reduce(t, group=self.process_group)
        return float(t) / self.world

    def any(self, flag: bool) -> bool:
        """True on every rank iff ``flag`` is True on some rank."""
        t = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.process_group)
        return bool(t.item() > 0)

    def grads_finite(self, model: nn.Module) -> bool:
        from .hooks import all_ranks_finite

        return all_ranks_finite(model, self.process_group)
