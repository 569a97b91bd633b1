"""Checks run on every dataset before training, with messages that say where.

Each failure raises :class:`DataError` naming the source, the array (and the
first offending index where it applies) and the rule, so a bad file is fixed
from the message alone instead of from a stack trace deep in the training loop.
"""

from __future__ import annotations

import numpy as np

from .arrays import RawArrays
from .errors import DataError
from .limits import Limits

__all__ = ["validate", "image_layout", "ImageLayout"]

_CHANNELS = (1, 3)

# (channels, image_size)
ImageLayout = tuple[int, int]


def _fail(source: str, where: str, rule: str) -> DataError:
    return DataError(f"{source}: {where}: {rule}")


def image_layout(x: np.ndarray, source: str, name: str) -> ImageLayout:
    """Check dtype/shape of image array ``name`` and return (channels, size).

    uint8 arrays are NHW or NHWC (the MNIST/CIFAR npz convention); float arrays
    are NHW or NCHW (already-tensorised data). Images must be square.
    """
    if x.dtype == np.uint8:
        layout = "NHWC"
    elif np.issubdtype(x.dtype, np.floating):
        layout = "NCHW"
    else:
        raise _fail(source, name, f"dtype {x.dtype} not supported; expected uint8 (NHW/NHWC) or float (NHW/NCHW)")
    if x.ndim == 3:
        channels, h, w = 1, x.shape[1], x.shape[2]
    elif x.ndim == 4:
        if layout == "NHWC":
            h, w, channels = x.shape[1:]
        else:
            channels, h, w = x.shape[1:]
    else:
        raise _fail(source, name, f"shape {x.shape} has {x.ndim} dims; expected 3 (NHW) or 4 ({layout})")
    if x.shape[0] == 0:
        raise _fail(source, name, "empty: 0 samples")
    if channels not in _CHANNELS:
        raise _fail(
            source, name, f"shape {x.shape}: {channels} channels in {layout} layout; expected one of {_CHANNELS}"
        )
    if h != w or h < 1:
        raise _fail(source, name, f"shape {x.shape}: images must be square and non-empty, got {h}x{w}")
    return channels, h


def _check_finite(x: np.ndarray, source: str, name: str) -> None:
    if np.issubdtype(x.dtype, np.floating):
        bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
        if bad.any():
            raise _fail(source, f"{name}[{int(np.argmax(bad))}]", "contains NaN or Inf")


def _check_labels(y: np.ndarray, n: int, source: str, name: str, num_classes: int, origin: str) -> None:
    if y.ndim != 1:
        raise _fail(source, name, f"shape {y.shape}: labels must be 1-D")
    if len(y) != n:
        raise _fail(source, name, f"{len(y)} labels for {n} images; counts must match")
    if not np.issubdtype(y.dtype, np.integer):
        raise _fail(source, name, f"dtype {y.dtype}: labels must be integers (int8..int64, uint8..uint64)")
    bad = (y < 0) | (y >= num_classes)
    if bad.any():
        i = int(np.argmax(bad))
        raise _fail(source, f"{name}[{i}]", f"label {int(y[i])} out of range [0, {num_classes}) ({origin})")


def validate(raw: RawArrays, expect: ImageLayout | None = None, limits: Limits | None = None) -> tuple[int, ImageLayout]:
    """Validate ``raw`` and return (num_classes, (channels, image_size)).

    ``expect`` pins the image layout, e.g. (1, 28) for MNIST; ``limits`` bounds the class count
    (labels of 2^40 or 10^5 classes are refused before a classifier of that size is built).
    """
    src = raw.source
    layout = image_layout(raw.x_train, src, "x_train")
    if expect is not None and layout != expect:
        raise _fail(
            src, "x_train",
            f"shape {raw.x_train.shape} gives {layout[0]} channel(s) of {layout[1]}x{layout[1]}; "
            f"expected {expect[0]} channel(s) of {expect[1]}x{expect[1]}",
        )
    _check_finite(raw.x_train, src, "x_train")

    limits = limits or Limits()
    if raw.num_classes is not None:
        num_classes, origin = raw.num_classes, f"num_classes={raw.num_classes}"
        if num_classes < 1:
            raise _fail(src, "num_classes", f"{num_classes}: must be >= 1")
    else:
        if raw.y_train.ndim == 1 and len(raw.y_train) and np.issubdtype(raw.y_train.dtype, np.integer):
            num_classes = int(raw.y_train.max()) + 1  # Python int: uint64 2^64-1 stays exact
        else:
            num_classes = 1  # the label checks below report the real problem
        origin = f"num_classes={num_classes} inferred from max(y_train)+1"
    # Before anything sized by the class count (one-hot targets, the classifier layer) is built.
    limits.check_classes(f"{src}: y_train", num_classes, origin)
    _check_labels(raw.y_train, len(raw.x_train), src, "y_train", num_classes, origin)

    if (raw.x_test is None) != (raw.y_test is None):
        raise _fail(src, "x_test/y_test", "must be given together")
    if raw.x_test is not None and raw.y_test is not None:
        test_layout = image_layout(raw.x_test, src, "x_test")
        if test_layout != layout or raw.x_test.dtype.kind != raw.x_train.dtype.kind:
            raise _fail(
                src, "x_test",
                f"shape {raw.x_test.shape} dtype {raw.x_test.dtype} does not match "
                f"x_train shape {raw.x_train.shape} dtype {raw.x_train.dtype}",
            )
        _check_finite(raw.x_test, src, "x_test")
        _check_labels(raw.y_test, len(raw.x_test), src, "y_test", num_classes, origin)
    return num_classes, layout
