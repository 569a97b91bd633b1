"""Seeded Gaussian-blob images: one random prototype image per class plus noise.

Useful for smoke tests and timing without any files; difficulty is set by
``noise`` (prototype pixels are N(0, 1)).
"""

from __future__ import annotations

import numpy as np

from .arrays import RawArrays

__all__ = ["make_synthetic_arrays"]


def make_synthetic_arrays(
    seed: int = 0,
    n: int = 2000,
    num_classes: int = 10,
    channels: int = 1,
    image_size: int = 8,
    noise: float = 1.0,
) -> RawArrays:
    rng = np.random.default_rng(seed)
    prototypes = rng.normal(size=(num_classes, channels, image_size, image_size))
    y = rng.integers(0, num_classes, size=n)
    x = prototypes[y] + noise * rng.normal(size=(n, channels, image_size, image_size))
    return RawArrays(f"synthetic(seed={seed})", x.astype(np.float32), y.astype(np.int64), num_classes=num_classes)
