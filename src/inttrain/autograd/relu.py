"""ReLU whose backward keeps a one-byte mask that compiled graphs store fast.

In a compiled training graph AOTAutograd saves ReLU's backward mask as ``bool``, and Inductor's C++ store of
a ``bool`` vector runs at ~10 ns per element on these CPUs (measured: 5.6 ms for a 512x1024 mask, more than the
int8 GEMM that follows it).  ``sign(y)`` cast to int8 is the same mask (``y >= 0``) and stores at ~0.35 ns
per element (0.18 ms).  Eager mode keeps torch's own ReLU.
"""

from __future__ import annotations

import torch

__all__ = ["relu_int8_mask"]


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _ReluInt8Mask(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.relu(x)
        ctx.save_for_backward(torch.sign(y).to(torch.int8))  # 1 where y > 0, else 0
        return y

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask.to(grad.dtype)


def relu_int8_mask(x: torch.Tensor) -> torch.Tensor:
    """``torch.relu(x)`` saving an int8 mask for backward (same gradient: 0 where ``x <= 0``)."""
    return _ReluInt8Mask.apply(x)
