"""NumPy ``.npz`` archives: arrays ``x, y`` or ``x_train, y_train[, x_test, y_test]``.

Images are uint8 NHW/NHWC (e.g. MNIST (N,28,28), CIFAR (N,32,32,3)) or float
NHW/NCHW. An optional 0-d integer array ``num_classes`` fixes the class count
(otherwise max(y_train)+1). Loaded with ``allow_pickle=False``: an .npz is
data, never code.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from .arrays import RawArrays
from .errors import DataError

__all__ = ["load_npz_arrays", "resolve_npz_path"]


def resolve_npz_path(data_dir: str | Path | None, dataset: str) -> Path:
    """``data_dir`` may be the .npz itself or a folder holding ``<dataset>.npz``."""
    if data_dir is None:
        raise DataError(f"{dataset}: data_dir: required; point it at an .npz file (or a folder with {dataset}.npz)")
    path = Path(data_dir)
    if path.is_dir():
        path = path / f"{dataset}.npz"
    if not path.is_file():
        raise DataError(f"{path}: data_dir: file not found (dataset {dataset!r} needs an .npz file)")
    return path


def _array(archive: np.lib.npyio.NpzFile, key: str, path: Path) -> np.ndarray:
    try:
        return archive[key]
    except ValueError as e:  # object arrays need pickle, which we refuse
        raise DataError(f"{path.name}: {key}: cannot load ({e})") from None


def load_npz_arrays(path: Path, num_classes: int | None = None) -> RawArrays:
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise DataError(f"{path.name}: file: not a readable .npz archive ({e})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(f"{path.name}: file: a single .npy array; expected an .npz archive with x,y arrays")
    with archive:
        keys = set(archive.files)
        if {"x_train", "y_train"} <= keys:
            names = ("x_train", "y_train", "x_test", "y_test")
        elif {"x", "y"} <= keys:
            names = ("x", "y", "", "")
        else:
            raise DataError(
                f"{path.name}: arrays: found {sorted(keys)}; expected x,y or x_train,y_train (+ optional x_test,y_test)"
            )
        x, y = _array(archive, names[0], path), _array(archive, names[1], path)
        x_test = _array(archive, names[2], path) if names[2] in keys else None
        y_test = _array(archive, names[3], path) if names[3] in keys else None
        if num_classes is None and "num_classes" in keys:
            nc = _array(archive, "num_classes", path)
            if nc.ndim != 0 or not np.issubdtype(nc.dtype, np.integer):
                raise DataError(f"{path.name}: num_classes: must be a 0-d integer array, got shape {nc.shape} {nc.dtype}")
            num_classes = int(nc)
    return RawArrays(path.name, x, y, x_test, y_test, num_classes)
