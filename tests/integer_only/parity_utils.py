"""Comparison helper shared by the integer-only parity tests."""

import numpy as np
import torch


def int_equal(t: torch.Tensor, a: np.ndarray) -> bool:
    """Same shape and the same integer values (dtype-independent: micro keeps accumulators in int64)."""
    assert not t.dtype.is_floating_point
    return tuple(t.shape) == np.shape(a) and torch.equal(t.to(torch.int64).cpu(), torch.from_numpy(np.asarray(a, dtype=np.int64)))
