"""MNIST: for now an .npz with uint8 images (N, 28, 28) and labels 0..9.

The official idx-format loader will live here too (dispatching on what
``data_dir`` contains); callers only use :func:`load_mnist_arrays`.
"""

from __future__ import annotations

from pathlib import Path

from .arrays import RawArrays
from .npz import load_npz_arrays, resolve_npz_path

__all__ = ["load_mnist_arrays", "MNIST_LAYOUT"]

MNIST_LAYOUT = (1, 28)  # channels, image size


def load_mnist_arrays(data_dir: str | Path | None) -> RawArrays:
    return load_npz_arrays(resolve_npz_path(data_dir, "mnist"), num_classes=10)
