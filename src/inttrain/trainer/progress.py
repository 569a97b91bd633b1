"""Step progress: a tqdm bar on an interactive terminal, plain lines otherwise.

Logs captured to files (CI, nohup, pipes) get a short line at most every
``interval_s`` seconds instead of carriage-return bar noise.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Progress"]


class Progress:
    def __init__(
        self,
        total: int,
        desc: str,
        log: Callable[[str], Any],
        tty: bool | None = None,
        interval_s: float = 10.0,
        initial: int = 0,
    ) -> None:
        """``initial``: steps of this span already done (a resumed epoch continues from there)."""
        self.total, self.desc, self.log, self.interval_s = total, desc, log, interval_s
        self._last = time.perf_counter()
        self._bar = None
        if tty if tty is not None else sys.stderr.isatty():
            from tqdm import tqdm  # lazy: keeps `import inttrain` cheap

            self._bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True, initial=initial)

    def update(self, step: int, loss: float) -> None:
        """``step`` is 1-based within this progress span."""
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            return
        now = time.perf_counter()
        if now - self._last >= self.interval_s:
            self._last = now
            self.log(f"  {self.desc} step {step}/{self.total} loss {loss:.4f}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
