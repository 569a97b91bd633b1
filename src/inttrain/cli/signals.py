"""Ctrl-C / SIGTERM during training: finish the current step, save ``last``, exit cleanly.

The handler only sets a flag that the loop polls after every step, so a
checkpoint is never written from inside a half-done optimizer step. A second
Ctrl-C raises KeyboardInterrupt at once (the escape hatch for a stuck step).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["stop_on_signals", "exit_code_for"]


def exit_code_for(signum: int) -> int:
    """Shell convention: 128 + signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + signum


@contextlib.contextmanager
def stop_on_signals(on_stop: Callable[[int], None]) -> Iterator[None]:
    """Call ``on_stop(signum)`` on the first SIGINT/SIGTERM; restore the old handlers after."""
    seen: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if seen and signum == signal.SIGINT:
            raise KeyboardInterrupt
        seen.append(signum)
        on_stop(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
