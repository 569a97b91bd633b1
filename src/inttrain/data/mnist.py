"""MNIST and Fashion-MNIST: the official idx files in a folder, or an .npz.

``data_dir`` may be a folder with ``train-images-idx3-ubyte[.gz]`` etc. (see
:mod:`.idx`), or an .npz (or a folder with ``<dataset>.npz``) holding uint8
images (N, 28, 28) and labels 0..9.
"""

from __future__ import annotations

from pathlib import Path

from .arrays import RawArrays
from .idx import find_idx_files, load_idx_arrays
from .limits import Limits
from .npz import load_npz_arrays, resolve_npz_path

__all__ = ["load_mnist_arrays", "MNIST_LAYOUT"]

MNIST_LAYOUT = (1, 28)  # channels, image size


def load_mnist_arrays(data_dir: str | Path | None, dataset: str = "mnist", limits: Limits | None = None) -> RawArrays:
    if data_dir is not None and Path(data_dir).is_dir():
        folder = Path(data_dir)
        # torchvision's layout keeps the idx files in <root>/<Name>/raw.
        for candidate in (folder, folder / "raw", folder / "MNIST" / "raw", folder / "FashionMNIST" / "raw"):
            if find_idx_files(candidate):
                return load_idx_arrays(candidate, dataset, limits=limits)
        if not (folder / f"{dataset}.npz").is_file():
            from .errors import DataError

            raise DataError(
                f"{folder}: data_dir: no {dataset} data; expected train-images-idx3-ubyte[.gz] + "
                f"train-labels-idx1-ubyte[.gz] (+ t10k-*) or {dataset}.npz"
            )
    return load_npz_arrays(resolve_npz_path(data_dir, dataset), num_classes=10, limits=limits)
