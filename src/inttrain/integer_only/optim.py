"""Integer SGD (docs/integer-training.md §7) on torch integer tensors; twin of :class:`inttrain.micro.SGD`.

The update rule is written once, in :class:`inttrain.micro.optim.SGDCore`, against a small array interface;
this module only plugs in that interface's torch primitives (:class:`~inttrain.integer_only.ops.TorchOps`), so both engines run the same
rule (shift or norm step, Q8 schedule multiplier, momentum, decay, saturation, exponent adaptation).
"""

from __future__ import annotations

from ..micro.optim import SGDCore
from .layers import Param
from .ops import TorchOps


class SGD(SGDCore):
    """The integer SGD of :class:`inttrain.micro.optim.SGDCore` over torch :class:`Param` s."""

    OPS = TorchOps

    def __init__(self, params: list[Param], lr_shift: int = 6, momentum_shift: int | None = None,
                 rounding: str = "pstoch", **kw):
        super().__init__(params, lr_shift, momentum_shift, rounding, **kw)
