"""CIFAR-10: the official binary (``cifar-10-batches-bin``) or python (``cifar-10-batches-py``) version, or an .npz.

Binary records are 3073 bytes: one label byte, then 32x32 red, green and
blue planes. ``data_dir`` may be the ``cifar-10-batches-bin`` folder or its
parent; ``data_batch_*.bin`` are the training set and ``test_batch.bin`` (if
present) the validation set. The python version (pickles, read without
executing anything: see :mod:`.cifar10_py`) is found the same way as
``cifar-10-batches-py/data_batch_1..5`` + ``test_batch``. An .npz holds uint8
images (N, 32, 32, 3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .arrays import RawArrays
from .cifar10_py import find_py_batches, read_cifar_py
from .errors import DataError
from .limits import FLOAT_IMAGE_BYTES, Limits
from .npz import load_npz_arrays, resolve_npz_path

__all__ = ["load_cifar10_arrays", "read_cifar_bin", "CIFAR10_LAYOUT"]

CIFAR10_LAYOUT = (3, 32)  # channels, image size
RECORD = 1 + 3 * 32 * 32


def read_cifar_bin(path: Path, limits: Limits | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 NHWC, labels int64) of one CIFAR-10 binary batch file, validated."""
    import stat

    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a device or pipe would never end
            raise DataError(f"{path.name}: file: not a regular file; allowed: a CIFAR-10 binary batch file")
        (limits or Limits()).check_bytes(path.name, f"a batch file of {info.st_size} bytes",
                                         info.st_size * (1 + FLOAT_IMAGE_BYTES))
        data = np.fromfile(path, dtype=np.uint8, count=info.st_size)
    except OSError as e:
        raise DataError(f"{path.name}: file: cannot read ({e})") from None
    if data.size == 0 or data.size % RECORD:
        raise DataError(
            f"{path.name}: length: {data.size} bytes is not a positive multiple of the {RECORD}-byte record "
            "(1 label + 3072 pixels); truncated or not a CIFAR-10 binary batch"
        )
    records = data.reshape(-1, RECORD)
    labels = records[:, 0].astype(np.int64)
    bad = labels >= 10
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(f"{path.name}: record {i}: label {labels[i]} out of range [0, 10)")
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # CHW planes -> NHWC
    return np.ascontiguousarray(images), labels


def _batches_folder(folder: Path) -> Path | None:
    for candidate in (folder, folder / "cifar-10-batches-bin"):
        if sorted(candidate.glob("data_batch_*.bin")):
            return candidate
    return None


def load_cifar10_arrays(data_dir: str | Path | None, limits: Limits | None = None) -> RawArrays:
    if data_dir is not None and Path(data_dir).is_dir():
        folder = _batches_folder(Path(data_dir))
        if folder is not None:
            parts = [read_cifar_bin(p, limits) for p in sorted(folder.glob("data_batch_*.bin"))]
            x = np.concatenate([p[0] for p in parts])
            y = np.concatenate([p[1] for p in parts])
            test = folder / "test_batch.bin"
            x_test, y_test = read_cifar_bin(test, limits) if test.is_file() else (None, None)
            return RawArrays(f"cifar10 bin ({folder})", x, y, x_test, y_test, num_classes=10)
        folder = find_py_batches(Path(data_dir))
        if folder is not None:
            batches = sorted(p for p in folder.glob("data_batch_*") if p.suffix == "")
            parts = [read_cifar_py(p) for p in batches]
            x = np.concatenate([p[0] for p in parts])
            y = np.concatenate([p[1] for p in parts])
            test = folder / "test_batch"
            x_test, y_test = read_cifar_py(test) if test.is_file() else (None, None)
            return RawArrays(f"cifar10 python ({folder})", x, y, x_test, y_test, num_classes=10)
        if not (Path(data_dir) / "cifar10.npz").is_file():
            raise DataError(
                f"{data_dir}: data_dir: no cifar10 data; expected cifar-10-batches-bin/data_batch_*.bin "
                "(+ test_batch.bin), cifar-10-batches-py/data_batch_* (+ test_batch) or cifar10.npz"
            )
    return load_npz_arrays(resolve_npz_path(data_dir, "cifar10"), num_classes=10, limits=limits)
