"""CIFAR-10: for now an .npz with uint8 images (N, 32, 32, 3) and labels 0..9.

The official CIFAR binary/pickle-free loader will live here too; callers only
use :func:`load_cifar10_arrays`.
"""

from __future__ import annotations

from pathlib import Path

from .arrays import RawArrays
from .npz import load_npz_arrays, resolve_npz_path

__all__ = ["load_cifar10_arrays", "CIFAR10_LAYOUT"]

CIFAR10_LAYOUT = (3, 32)  # channels, image size


def load_cifar10_arrays(data_dir: str | Path | None) -> RawArrays:
    return load_npz_arrays(resolve_npz_path(data_dir, "cifar10"), num_classes=10)
