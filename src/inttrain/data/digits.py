"""scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes).

Ships inside scikit-learn, so it works offline: the default dataset.
"""

from __future__ import annotations

import numpy as np

from .arrays import RawArrays

__all__ = ["load_digits_arrays"]


def load_digits_arrays() -> RawArrays:
    from sklearn.datasets import load_digits  # lazy: sklearn import is slow

    d = load_digits()
    # Pixel values are 0..16; scale to [0, 1] so it behaves like other float data.
    x = (d.images / 16.0).astype(np.float32)  # [N, 8, 8]
    return RawArrays("sklearn load_digits", x, d.target.astype(np.int64), num_classes=10)
