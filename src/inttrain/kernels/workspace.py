"""Reusable scratch buffers for integer accumulators.

glibc hands every allocation of 32 MB or more straight back to the OS, so a fresh int32
accumulator of that size pays page faults on every GEMM (measured here: ~40 ms to allocate
and fill a 100 MB tensor, about a third of the int8 GEMM that writes it).  An accumulator
is consumed by the dequantizing epilogue right after the GEMM, so one buffer per shape,
per thread, can be reused across layers and steps.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["scratch"]

_LOCAL = threading.local()


def scratch(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A buffer of ``shape``/``dtype`` reused across calls: valid only until the next call for that shape."""
    buffers = getattr(_LOCAL, "buffers", None)
    if buffers is None:
        buffers = _LOCAL.buffers = {}
    key = (tuple(shape), dtype, str(device))
    buf = buffers.get(key)
    if buf is None:
        buf = buffers[key] = torch.empty(shape, dtype=dtype, device=device)
    return buf
