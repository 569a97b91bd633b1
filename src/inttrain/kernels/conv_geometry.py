"""The geometry of a 2-D convolution, shared by every conv kernel backend."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConvGeometry"]


@dataclass(frozen=True)
class ConvGeometry:
    """Stride, zero padding and dilation as (height, width) pairs, and the group count (as in ``nn.Conv2d``)."""

    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
