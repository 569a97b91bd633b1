"""CIFAR-10 "python version" (``cifar-10-batches-py/data_batch_1..5``, ``test_batch``).

Each batch is a Python-2 pickle of a dict with bytes keys: ``b"data"`` a uint8
array (N, 3072) of red, green, blue 32x32 planes per row, ``b"labels"`` a list
of N ints in 0..9 (plus ``b"batch_label"`` and ``b"filenames"``, unused). The
pickles are read with :mod:`.safe_pickle`, which refuses any global but the
numpy array ones: a tampered batch cannot run code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataError
from .safe_pickle import load_restricted_pickle

__all__ = ["read_cifar_py", "find_py_batches"]


def _field(batch: dict[Any, Any], key: str) -> Any:
    # Python-2 str keys load as bytes; a re-pickled file may use str keys.
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    return None


def read_cifar_py(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 NHWC, labels int64) of one python-version batch, validated."""
    batch = load_restricted_pickle(path)
    if not isinstance(batch, dict):
        raise DataError(f"{path.name}: pickle: holds a {type(batch).__name__}; expected the batch dict (data, labels)")
    data, labels = _field(batch, "data"), _field(batch, "labels")
    if data is None or labels is None:
        raise DataError(f"{path.name}: keys: found {sorted(map(repr, batch))}; expected b'data' and b'labels'")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        what = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{path.name}: data: {what}; expected a uint8 array (N, 3072)")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError):
        raise DataError(f"{path.name}: labels: not a list of integers") from None
    if y.shape != (len(data),):
        raise DataError(f"{path.name}: labels: {y.size} labels for {len(data)} images; counts must match")
    bad = (y < 0) | (y >= 10)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(f"{path.name}: labels[{i}]: label {y[i]} out of range [0, 10)")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # RGB planes -> NHWC
    return np.ascontiguousarray(images), y


def find_py_batches(folder: Path) -> Path | None:
    """The folder holding ``data_batch_*`` pickles: ``folder`` itself or its ``cifar-10-batches-py``."""
    for candidate in (folder, folder / "cifar-10-batches-py"):
        if [p for p in candidate.glob("data_batch_*") if p.suffix == ""]:
            return candidate
    return None
