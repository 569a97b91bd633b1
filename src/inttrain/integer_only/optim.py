"""Integer SGD (docs/integer-training.md §7) on torch integer tensors; twin of :class:`inttrain.micro.SGD`.

The update rule is written once, in :class:`inttrain.micro.optim.SGDCore`, against a small array interface;
this module only supplies that interface's torch primitives (:class:`TorchOps`), so both engines run the same
rule (shift or norm step, Q8 schedule multiplier, momentum, decay, saturation, exponent adaptation).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..micro.optim import SGDCore
from . import ops as _ops
from .layers import Param


#: :class:`inttrain.micro.optim.NumpyOps` on torch integer tensors (exact, device-agnostic)
TorchOps = SimpleNamespace(
    shift=_ops.shift, shift_round=_ops.shift_round, absmax=_ops.absmax, clip=torch.clamp,
    wide=lambda a: a.to(torch.int64), int32=lambda a: a.to(torch.int32), cast_like=lambda a, ref: a.to(ref.dtype),
    zeros=lambda ref, bits: torch.zeros(ref.shape, dtype=torch.int64 if bits == 64 else torch.int32, device=ref.device))


class SGD(SGDCore):
    """The integer SGD of :class:`inttrain.micro.optim.SGDCore` over torch :class:`Param` s."""

    OPS = TorchOps

    def __init__(self, params: list[Param], lr_shift: int = 6, momentum_shift: int | None = None,
                 rounding: str = "pstoch", **kw):
        super().__init__(params, lr_shift, momentum_shift, rounding, **kw)
