"""Activation memory of a training step, measured: the bytes autograd keeps for backward.

:func:`saved_activation_bytes` runs a forward pass under ``torch.autograd.graph.saved_tensors_hooks``
and sums the bytes of every distinct storage saved for backward, parameters excluded (they exist
anyway).  A storage saved by two ops (a ReLU output that the next convolution also keeps) is counted
once, as it is held once.  An int8 :class:`~inttrain.autograd.qactivation.QActivation` counts its
codes and scale.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from inttrain.autograd.qactivation import QActivation

__all__ = ["saved_activation_bytes"]


def _storages(t: torch.Tensor) -> list[tuple[int, int]]:
    """(address, bytes) of the storages behind ``t``."""
    if isinstance(t, QActivation):
        return _storages(t.codes) + _storages(t.scale)
    st = t.untyped_storage()
    return [(st.data_ptr(), st.nbytes())]


def saved_activation_bytes(model: nn.Module, forward: Callable[[], torch.Tensor]) -> int:
    """Bytes of the distinct non-parameter tensors saved for backward while ``forward()`` runs.

    ``forward`` returns the loss (or output); the graph is freed before returning.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        for ptr, nbytes in _storages(t):
            if ptr not in params:
                seen[ptr] = max(seen.get(ptr, 0), nbytes)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return sum(seen.values())
