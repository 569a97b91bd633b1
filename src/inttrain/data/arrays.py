"""Raw arrays as loaders produce them, before validation and splitting.

Each loader (digits, synthetic, npz, later MNIST idx / CIFAR binary) returns a
:class:`RawArrays`; :mod:`.validate` checks it and :mod:`.splits` turns it into
tensors. Keeping this boundary means a new file format is one new module.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RawArrays"]


@dataclass
class RawArrays:
    """Images and labels straight from a source.

    ``x_*`` is uint8 in NHW/NHWC layout or float in NHW/NCHW layout; ``y_*`` is
    1-D integer. ``x_test``/``y_test`` are optional; when present they are used
    as the validation split. ``num_classes=None`` means "infer from y_train".
    """

    source: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    num_classes: int | None = None
