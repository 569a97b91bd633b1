"""Data-parallel training for :func:`inttrain.trainer.train` (``inttrain train --nproc N`` / torchrun).

:class:`DataParallel` is what the training loop needs from ``torch.distributed``: wrap the model in
DDP with the chosen gradient communication (``fp32`` all-reduce or the ``int8`` hook), take this
rank's shard of each global batch, average the loss across ranks, and agree on skip/stop flags so
every rank takes (or skips) the same steps.

The global batch is the configured ``batch_size``; rank ``r`` of ``W`` takes rows
``[r * batch_size / W, (r + 1) * batch_size / W)`` of it, so with the same seed the data order,
the steps per epoch and the checkpoints are those of a single-process run with the same batch size.

Checkpoints of the int8 hook carry every rank's error-feedback residuals (``state["comm"]``,
gathered to rank 0 when ``last`` is saved); a resume on the same number of processes gives each
rank its own back, so an interrupted run (``torchrun --max-restarts``, ``--max-restarts``) ends
bit-identical to an uninterrupted one. ``sync_bn`` converts plain BatchNorm layers to
:class:`~inttrain.distributed.sync_bn.CPUSyncBatchNorm` (statistics over the global batch).

Testing hook: ``INTTRAIN_FAULT_STEP=k`` makes rank ``INTTRAIN_FAULT_RANK`` (default 1) exit
(``INTTRAIN_FAULT_MODE=exit``, code 17) or hang (``hang``) right after step ``k``, on the first
attempt only (``TORCHELASTIC_RESTART_COUNT`` unset or 0).
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
    sync_bn: bool = False

    def __post_init__(self) -> None:
        if self.comm not in COMM_MODES:
            raise ValueError(f"comm must be one of {', '.join(COMM_MODES)}; got {self.comm!r}")
        self.rank = dist.get_rank(self.process_group)
        self.world = dist.get_world_size(self.process_group)

    def wrap(self, model: nn.Module) -> nn.Module:
        """DDP around ``model`` (parameters broadcast from rank 0) with the chosen comm hook."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        from .hooks import FP32HookState, Int8HookState, fp32_allreduce_hook, int8_allreduce_hook

        if self.sync_bn:
            from .sync_bn import convert_sync_batchnorm_

            convert_sync_batchnorm_(model, self.process_group)
        ddp = DDP(model, process_group=self.process_group)
        if self.comm == "int8":
            self.hook_state = Int8HookState(process_group=self.process_group, seed=self.seed).bind(model)
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

    # ------------------------------------------------------------------ checkpoints and restarts
    def comm_state(self) -> dict[str, Any] | None:
        """Every rank's hook state, gathered to rank 0 (a collective: call it on every rank).

        None for fp32 (nothing to keep); for int8 ``{"comm", "world", "ranks": [state per rank]}`` on
        rank 0 (``ranks`` is empty on the others, which write no checkpoint).
        """
        if self.comm != "int8" or self.hook_state is None:
            return None
        mine = self.hook_state.state_dict()
        ranks: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dst = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        dist.gather_object(mine, ranks, dst=dst, group=self.process_group)
        return {"comm": self.comm, "world": self.world, "ranks": ranks or []}

    def load_comm_state(self, saved: dict[str, Any] | None) -> str:
        """Give this rank its saved hook state back; returns a line for the log ("" if nothing to say)."""
        if self.comm != "int8" or self.hook_state is None:
            return ""
        if not saved or saved.get("comm") != "int8":
            return "int8 communication: no saved residuals in the checkpoint; error feedback starts at zero"
        if int(saved["world"]) != self.world:
            return (f"int8 communication: checkpoint residuals are from {saved['world']} processes, this run has "
                    f"{self.world}; error feedback starts at zero")
        self.hook_state.load_state_dict(saved["ranks"][self.rank])
        return f"int8 communication: restored the error-feedback residuals of {self.world} ranks"

    def wrap_hooks(self, hooks: Any) -> Any:
        """The loop's hooks with the comm state added to ``last`` checkpoints (and the fault-injection hook)."""
        return _RankHooks(hooks, self)

    def fault_point(self, step: int) -> None:
        """The ``INTTRAIN_FAULT_*`` testing hook (see module doc); a no-op unless those are set."""
        want = os.environ.get("INTTRAIN_FAULT_STEP")
        if not want or int(want) != step or int(os.environ.get("INTTRAIN_FAULT_RANK", "1")) != self.rank:
            return
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
            return
        import sys
        import time

        mode = os.environ.get("INTTRAIN_FAULT_MODE", "exit")
        print(f"rank {self.rank}: INTTRAIN_FAULT_STEP={step}: injected fault ({mode})", file=sys.stderr, flush=True)
        if mode == "hang":
            while True:
                time.sleep(3600)
        os._exit(17)


class _RankHooks:
    """Delegates to the run's hooks; ``save("last")`` first gathers the comm state (on every rank)."""

    def __init__(self, inner: Any, dp: DataParallel) -> None:
        self.inner, self.dp = inner, dp

    def on_step(self, state: Any, loss: Any, lr: float, seconds: float) -> None:
        self.inner.on_step(state, loss, lr, seconds)
        self.dp.fault_point(state.step)

    def on_epoch(self, *args: Any) -> None:
        self.inner.on_epoch(*args)

    def should_stop(self) -> bool:
        return self.inner.should_stop()

    def save(self, name: str, snapshot: Any) -> None:
        # "last" is saved at the same step on every rank (epoch end, --save-every, agreed stop), so the
        # gather is safe there; "best" may differ between ranks (per-rank BN statistics) and is never resumed.
        if name != "last":
            self.inner.save(name, snapshot)
            return
        comm = self.dp.comm_state()

        def with_comm() -> Any:
            weights, state = snapshot()
            return weights, ({**state, "comm": comm} if comm is not None else state)

        self.inner.save(name, with_comm)
