"""Distributed data-parallel training with int8 gradient communication (PyTorch DDP, torchrun).

See ``docs/distributed.md``.
"""

from inttrain.distributed.hooks import (
    FP32HookState,
    Int8HookState,
    all_ranks_finite,
    fp32_allreduce_hook,
    int8_allreduce_hook,
)

__all__ = ["Int8HookState", "int8_allreduce_hook", "FP32HookState", "fp32_allreduce_hook", "all_ranks_finite"]
