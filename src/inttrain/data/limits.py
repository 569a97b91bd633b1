"""Size limits judged from headers and descriptions *before* the reads and allocations they imply.

A hostile or broken file can declare a shape of 10^12 elements in 100 bytes, a zip member that expands
to gigabytes, or a PNG of 10^5 x 10^5 pixels. Every loader asks :class:`Limits` first and raises
:class:`LimitError` (one ``error:`` line, exit 2) while its own memory use is still small.

The defaults are generous for real work: data and model together may use up to 80% of the machine's
physical memory (``max_memory_gb``), up to 10,000 classes (``max_classes``) and images of up to
8192 x 8192 pixels (``max_image_side``). All three are run-config keys (``--set max_memory_gb=200``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from inttrain.spec.errors import LimitError

__all__ = ["Limits", "LimitError", "physical_memory_bytes", "TEXT_BYTES_PER_CHAR", "FLOAT_IMAGE_BYTES"]

#: Peak bytes per character of the text dataset: the UTF-8 bytes, the decoded str, a Python list of ids
#: while encoding (8-byte pointers to cached small ints), int64 ids and the input/target windows.
TEXT_BYTES_PER_CHAR = 48
#: Bytes per image element after loading: float32 NCHW copy plus the tensor the splits hold.
FLOAT_IMAGE_BYTES = 8


def physical_memory_bytes() -> int:
    """Physical memory of this machine (16 GiB where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def _default_memory() -> int:
    return int(physical_memory_bytes() * 0.8)


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.3g} GiB"


@dataclass(frozen=True)
class Limits:
    """What a run may allocate; ``memory_bytes`` bounds data and model (parameters, optimizer, activations)."""

    memory_bytes: int = field(default_factory=_default_memory)
    max_classes: int = 10_000
    max_image_side: int = 8192

    @classmethod
    def from_config(cls, max_memory_gb: float | None = None, max_classes: int | None = None,
                    max_image_side: int | None = None) -> Limits:
        kw: dict = {}
        if max_memory_gb is not None:
            kw["memory_bytes"] = int(max_memory_gb * (1 << 30))
        if max_classes is not None:
            kw["max_classes"] = max_classes
        if max_image_side is not None:
            kw["max_image_side"] = max_image_side
        return cls(**kw)

    def check_bytes(self, where: str, what: str, needed: int) -> None:
        """LimitError unless ``needed`` bytes fit the memory budget."""
        if needed > self.memory_bytes:
            raise LimitError(
                f"{where}: {what} would need {_gib(needed)}, more than the memory limit of {_gib(self.memory_bytes)}; "
                "allowed: up to max_memory_gb (default 80% of physical memory; raise it with --set max_memory_gb=N)"
            )

    def check_classes(self, where: str, num_classes: int, origin: str) -> None:
        if num_classes > self.max_classes:
            raise LimitError(
                f"{where}: {num_classes} classes ({origin}) exceed the limit of {self.max_classes}; allowed: "
                "labels in [0, max_classes) (raise it with --set max_classes=N if the data really has that many)"
            )

    def check_image(self, where: str, width: int, height: int) -> None:
        side = self.max_image_side
        if width > side or height > side:
            raise LimitError(f"{where}: image of {width}x{height} pixels; allowed: at most {side}x{side} "
                             "(--set max_image_side=N)")
