"""Reusable scratch buffers for integer accumulators.

glibc hands every allocation of 32 MB or more straight back to the OS, so a fresh int32
accumulator of that size pays page faults on every GEMM (measured here: ~40 ms to allocate
and fill a 100 MB tensor, about a third of the int8 GEMM that writes it).  An accumulator
is consumed by the dequantizing epilogue right after the GEMM, so one buffer per shape,
per thread, can be reused across layers and steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading

import torch

__all__ = ["scratch", "WORKSPACE", "Workspace", "keep_freed_memory"]

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc refuses larger mmap thresholds on 64-bit systems


def keep_freed_memory(trim_threshold: int = 1 << 30, top_pad: int = 64 << 20) -> bool:
    """Tell glibc's malloc to keep freed memory for reuse instead of handing it back to the OS; True if applied.

    A training step allocates and frees the same activation and gradient buffers every step.  By default glibc
    returns freed memory at the top of the heap to the OS once more than a few megabytes are free there, and
    serves buffers from 128 kB up to 32 MB with fresh ``mmap`` pages at first: the next step then pays a page
    fault for every 4 kB it touches again (measured here: 13% of a compiled int8 ResNet-20 step, 254 -> 220 ms
    at 1 thread; bf16 233 -> 222 ms).  This sets the trim threshold to ``trim_threshold`` bytes, pads each heap
    growth by ``top_pad`` and serves buffers below 32 MB from the heap.  Process-wide, like
    ``torch.set_num_threads``: for applications (the ``inttrain`` CLI and the benchmarks call it at start), never
    called by the library itself.  A no-op returning False where the C library is not glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    limit = (1 << 31) - 1  # the parameters are C ints
    settings = ((_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX), (_M_TRIM_THRESHOLD, min(trim_threshold, limit)),
                (_M_TOP_PAD, min(top_pad, limit)))
    return all(mallopt(param, value) == 1 for param, value in settings)


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
