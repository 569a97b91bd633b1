"""What the integer layers support, declared once.

:func:`inttrain.prepare_` checks each converted layer's precision against these when it converts it
(``QLinear`` / ``QConv2d`` ``_validate``, which the precision schedules also go through), so recipes,
schedules and the CLI state no limits of their own.
"""

from __future__ import annotations

from .formats import MAX_BITS, MIN_BITS, PerChannel, PerTensor
from .precision import LayerPrecision

__all__ = ["GEMM_BITS", "CONV_PER_TENSOR", "CONV_PER_SAMPLE", "conv_layout_problem"]

#: Code widths of every integer GEMM operand, for Linear, Conv2d and GPT-2 Conv1D alike: up to 8 bits on
#: int8 kernels directly, 9..16 bits as two exact int8 halves (``kernels.matmul.split_int16``).
GEMM_BITS: tuple[int, int] = (MIN_BITS, MAX_BITS)

#: Conv2d operands that enter the channel x window reduction: their scale must not vary along it, so they
#: are quantized per tensor. (GEMM, operand, what it is.)
CONV_PER_TENSOR: tuple[tuple[str, str, str], ...] = (
    ("forward", "lhs", "activation"),
    ("grad_input", "lhs", "output gradient"),
    ("grad_weight", "rhs", "activation"),
)


#: Of those, the ones that may instead take one scale per sample (``PerChannel(0)`` on NCHW): the reduction never
#: crosses samples, so a sample's scale factors out of its outputs (the kernel runs at scale 1, at any code width).
CONV_PER_SAMPLE: tuple[tuple[str, str], ...] = (("grad_input", "lhs"),)


def conv_layout_problem(prec: LayerPrecision) -> str | None:
    """Why a convolution cannot run ``prec`` (None: it can)."""
    for gemm, side, what in CONV_PER_TENSOR:
        g = getattr(prec, gemm)
        spec = getattr(g, side)
        if g.integer and (gemm, side) in CONV_PER_SAMPLE and spec.granularity == PerChannel(0):
            continue
        if g.integer and not isinstance(spec.granularity, PerTensor):
            return (f"conv2d {gemm} GEMM: the {side} ({what}) must be quantized PerTensor (its scale would vary "
                    f"along the reduction), got {spec.granularity}")
    return None
