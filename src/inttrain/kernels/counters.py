"""Counts of integer kernel launches, so tests and users can check that integer arithmetic really ran.

(torchao's int8 training config once silently stayed in float; a counter makes that visible.)
"""

from __future__ import annotations

from collections import Counter

__all__ = ["count", "int_kernel_calls", "reset_kernel_calls"]

_CALLS: Counter[str] = Counter()


def count(kind: str, n: int = 1) -> None:
    _CALLS[kind] += n


def int_kernel_calls() -> dict[str, int]:
    """Calls of each integer kernel since the last reset, e.g. ``{"int8_mm": 6, "conv_fwd": 2}``."""
    return dict(_CALLS)


def reset_kernel_calls() -> None:
    _CALLS.clear()
