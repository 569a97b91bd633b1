"""Datasets: ``load_dataset(name, ...)`` -> validated train/val ``TensorDataset``s.

Available: ``digits`` (default; bundled with scikit-learn, offline),
``synthetic`` (seeded Gaussian blobs), ``npz`` (any .npz), ``mnist`` /
``fashion-mnist`` (official idx files or an .npz), ``cifar10`` (the official
binary batches or an .npz), ``folder`` (one sub-folder of images per class)
and ``text`` (a UTF-8 file for character-level language models). Every dataset is
validated before training; problems raise :class:`DataError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from .arrays import RawArrays
from .cifar10 import CIFAR10_LAYOUT, load_cifar10_arrays
from .digits import load_digits_arrays
from .errors import DataError
from .folder import load_folder_arrays
from .limits import LimitError, Limits
from .mnist import MNIST_LAYOUT, load_mnist_arrays
from .npz import load_npz_arrays, resolve_npz_path
from .splits import DatasetSplits, make_splits, normalise
from .synthetic import make_synthetic_arrays
from .text import load_text_splits
from .validate import ImageLayout, validate

__all__ = ["DATASET_NAMES", "DataError", "LimitError", "Limits", "load_eval_dataset", "DatasetSplits", "RawArrays", "load_dataset", "splits_from_arrays"]

# name -> (loader(data_dir, seed, limits), pinned layout or None)
_Loader = Callable[[str | Path | None, int, Limits], RawArrays]
_LOADERS: dict[str, tuple[_Loader, ImageLayout | None]] = {
    "digits": (lambda data_dir, seed, limits: load_digits_arrays(), None),
    "synthetic": (lambda data_dir, seed, limits: make_synthetic_arrays(seed), None),
    "npz": (lambda data_dir, seed, limits: load_npz_arrays(resolve_npz_path(data_dir, "npz"), limits=limits), None),
    "mnist": (lambda data_dir, seed, limits: load_mnist_arrays(data_dir, limits=limits), MNIST_LAYOUT),
    "fashion-mnist": (lambda data_dir, seed, limits: load_mnist_arrays(data_dir, "fashion-mnist", limits), MNIST_LAYOUT),
    "cifar10": (lambda data_dir, seed, limits: load_cifar10_arrays(data_dir, limits), CIFAR10_LAYOUT),
    "folder": (lambda data_dir, seed, limits: load_folder_arrays(data_dir, limits), None),
}

#: Names accepted by :func:`load_dataset`.
DATASET_NAMES: tuple[str, ...] = (*_LOADERS, "text")

#: Default held-out fraction when a source has no test split (text: the end of the file).
DEFAULT_VAL_FRACTION = {"text": 0.1}


def splits_from_arrays(
    raw: RawArrays, name: str, val_fraction: float = 0.2, seed: int = 0, expect: ImageLayout | None = None,
    limits: Limits | None = None,
) -> DatasetSplits:
    """Validate ``raw`` and split it; the path every loader goes through."""
    num_classes, layout = validate(raw, expect, limits)
    return make_splits(raw, name, num_classes, layout, val_fraction, seed)


def load_dataset(
    name: str,
    data_dir: str | Path | None = None,
    val_fraction: float | None = None,
    seed: int = 0,
    seq_len: int = 64,
    limits: Limits | None = None,
) -> DatasetSplits:
    """Load, validate and split dataset ``name``.

    ``data_dir`` is the data folder (idx files, cifar-10-batches-bin, class
    sub-folders), .npz file or text file for the file-backed datasets; ``seed`` fixes the train/val split (and the
    synthetic data). If the source has a test split, it is the val set and
    ``val_fraction`` (default 0.2; text: 0.1 from the end of the file) is unused.
    ``seq_len`` is the text dataset's context length. Raises ValueError for an
    unknown name, :class:`DataError` for bad data and :class:`LimitError` for data
    whose headers declare more than ``limits`` allow (judged before reading it).
    """
    limits = limits or Limits()
    if val_fraction is None:
        val_fraction = DEFAULT_VAL_FRACTION.get(name, 0.2)
    if name == "text":  # token sequences, not images: its own validation and splitting
        return load_text_splits(data_dir, seq_len, val_fraction, limits)
    try:
        loader, expect = _LOADERS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(DATASET_NAMES)}") from None
    return splits_from_arrays(loader(data_dir, seed, limits), name, val_fraction, seed, expect, limits)


def load_eval_dataset(
    name: str,
    data_dir: str | Path | None,
    num_classes: int,
    layout: ImageLayout,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    limits: Limits | None = None,
) -> tuple[TensorDataset, str]:
    """Every example of an image source, for evaluating a trained model: (dataset, what was taken).

    A source with a test split gives its whole test split, one without gives every example (no
    held-out slice). Labels must fall in the model's ``num_classes``, images must have its ``layout``
    (channels, size), and they are standardised with the training ``mean``/``std`` the model saw.
    """
    limits = limits or Limits()
    try:
        loader, expect = _LOADERS[name]
    except KeyError:
        raise ValueError(f"unknown image dataset {name!r}; allowed: {', '.join(_LOADERS)}") from None
    raw = dataclasses.replace(loader(data_dir, 0, limits), num_classes=num_classes)
    validate(raw, layout, limits)  # labels vs the model's classes, images vs its input shape
    if raw.x_test is not None and raw.y_test is not None:
        x, y, what = raw.x_test, raw.y_test, "its whole test split"
    else:
        x, y, what = raw.x_train, raw.y_train, "every example"
    return TensorDataset(normalise(x, mean, std), torch.from_numpy(y.astype(np.int64))), what
