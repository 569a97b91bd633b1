"""Counts of integer kernel launches, so tests and users can check that integer arithmetic really ran.

(torchao's int8 training config once silently stayed in float; a counter makes that visible.)
"""

from __future__ import annotations

from collections import Counter

__all__ = ["count", "int_kernel_calls", "reset_kernel_calls", "KERNEL_CALLS"]


class _KernelCalls(Counter):
    """Owner of the process-wide launch counts (kind -> calls): the kernels :meth:`count`, users read them with
    :func:`int_kernel_calls` and :meth:`clear` them with :func:`reset_kernel_calls`."""

    def count(self, kind: str, n: int = 1) -> None:
        self[kind] += n


KERNEL_CALLS = _KernelCalls()

#: ``KERNEL_CALLS.count``: what each integer kernel calls once per launch.
count = KERNEL_CALLS.count


def int_kernel_calls() -> dict[str, int]:
    """Calls of each integer kernel since the last reset, e.g. ``{"int8_mm": 6, "conv_fwd": 2}``."""
    return dict(KERNEL_CALLS)


def reset_kernel_calls() -> None:
    KERNEL_CALLS.clear()
