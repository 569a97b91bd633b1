"""NumPy ``.npz`` archives: arrays ``x, y`` or ``x_train, y_train[, x_test, y_test]``.

Images are uint8 NHW/NHWC (e.g. MNIST (N,28,28), CIFAR (N,32,32,3)) or float
NHW/NCHW. An optional 0-d integer array ``num_classes`` fixes the class count
(otherwise max(y_train)+1). Loaded with ``allow_pickle=False``: an .npz is
data, never code. Before any array is read, every member's .npy header is checked
against the archive (declared bytes <= stored uncompressed bytes, no Python
objects) and the arrays' total size against :class:`~inttrain.data.limits.Limits`;
decompression never goes past a member's declared size, so a zip bomb is
refused from its directory, not after it expanded.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from .arrays import RawArrays
from inttrain.spec.errors import InttrainError

from .errors import DataError
from .limits import FLOAT_IMAGE_BYTES, Limits

__all__ = ["check_npz_members", "load_npz_arrays", "resolve_npz_path"]


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
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError, zlib.error) as e:
        # object arrays need pickle, which we refuse; truncated or corrupt members fail their CRC
        raise DataError(f"{path.name}: {key}: cannot load ({type(e).__name__}: {e})") from None


def _member_header(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from a member's .npy header, read without reading its data."""
    with z.open(info) as f:
        version = np.lib.format.read_magic(f)
        reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0,
                  (3, 0): np.lib.format.read_array_header_2_0}.get(version)
        if reader is None:
            raise DataError(f"{path.name}: {info.filename}: .npy version {version}; allowed: 1.0, 2.0, 3.0")
        shape, _, dtype = reader(f)
    return tuple(int(d) for d in shape), dtype


def check_npz_members(path: Path, limits: Limits) -> None:
    """Judge every member from the zip directory and its .npy header; DataError/LimitError before any data is read."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = [i for i in z.infolist() if not i.is_dir()]
            limits.check_bytes(path.name, f"its {len(infos)} arrays (uncompressed)", sum(i.file_size for i in infos))
            need = 0
            for info in infos:
                key = info.filename.removesuffix(".npy")  # the array's name, as np.load calls it
                shape, dtype = _member_header(z, info, path)
                if dtype.hasobject:
                    raise DataError(f"{path.name}: {key}: holds Python objects (dtype {dtype}); "
                                    "allowed: numeric arrays (an .npz is data, never code)")
                count = 1
                for d in shape:
                    count *= d  # Python int: no overflow
                if count * dtype.itemsize > info.file_size:
                    raise DataError(f"{path.name}: {key}: header declares shape {shape} {dtype} "
                                    f"({count * dtype.itemsize} bytes) but the member holds {info.file_size} bytes; "
                                    "allowed: a header that matches its data")
                need += info.file_size + (count * FLOAT_IMAGE_BYTES if key.startswith("x") else 0)
            limits.check_bytes(path.name, "loading and converting its arrays", need)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError, zlib.error) as e:
        if isinstance(e, InttrainError):  # our own refusal (DataError, LimitError): already worded
            raise
        raise DataError(f"{path.name}: file: not a readable .npz archive ({type(e).__name__}: {e}); "
                        "allowed: an .npz written by numpy.savez[_compressed]") from None


def load_npz_arrays(path: Path, num_classes: int | None = None, limits: Limits | None = None) -> RawArrays:
    if zipfile.is_zipfile(path):
        check_npz_members(path, limits or Limits())
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise DataError(f"{path.name}: file: not a readable .npz archive ({type(e).__name__}: {e}); "
                        "allowed: an .npz written by numpy.savez[_compressed]") from None
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
