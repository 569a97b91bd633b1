"""Shared by the integer-only parity tests."""

import numpy as np
import pytest


@pytest.fixture(scope="session")
def digits():
    """scikit-learn digits as int8 codes: pixel 0..16 -> min(8 * pixel, 127) at exponent -7."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.minimum(d.data * 8, 127).astype(np.int8)
    perm = np.random.default_rng(0).permutation(len(x))
    tr, te = perm[:1437], perm[1437:]
    return x[tr], x[te], d.target[tr].astype(np.int64), d.target[te].astype(np.int64)
