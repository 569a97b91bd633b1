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

__all__ = ["scratch", "WORKSPACE", "Workspace"]


class Workspace(threading.local):
    """Owner of the scratch buffers, one set per thread (a ``threading.local``: two threads never share a
    buffer).  this module holds the one instance, :data:`WORKSPACE`; :meth:`clear` frees the calling
    thread's buffers (the next call allocates afresh)."""

    def __init__(self) -> None:  # runs once in each thread that touches the workspace
        self.buffers: dict[tuple, torch.Tensor] = {}

    def scratch(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A buffer of ``shape``/``dtype`` reused across calls: valid only until the next call for that shape."""
        key = (tuple(shape), dtype, str(device))
        buf = self.buffers.get(key)
        if buf is None:
            buf = self.buffers[key] = torch.empty(shape, dtype=dtype, device=device)
        return buf

    def clear(self) -> None:
        """Free this thread's buffers."""
        self.buffers.clear()


WORKSPACE = Workspace()

#: ``WORKSPACE.scratch``: the function the GEMM paths call.
scratch = WORKSPACE.scratch
