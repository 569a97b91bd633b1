"""The elementwise and per-channel passes of the int8 dataflow ops, fused with torch.compile.

Every function here reads or writes int8 activation codes stored as ``uint8 = code + 128`` in a
channels-last ``[rows, C]`` matrix view (rows = N*H*W), with a per-tensor (``[1]``) or per-channel
(``[C]``) float32 scale.  Eager torch spends 3-6 memory passes and temporaries on each (measured:
an eager ReLU backward on mismatched layouts took 12 ms per 1M elements here); compiled, each is one
or two passes.  With ``INTTRAIN_COMPILE=0`` the same functions run eagerly (tested equal).

Batch norm works on the values ``x = scale * (code - 128)``:
    forward   mean = E[x], var = E[(x - mean)^2] (biased, as torch's training BN), invstd = 1/sqrt(var+eps),
              y = (x - mean) * invstd * w + b
    backward  xhat = (x - mean) * invstd, db = sum g, dw = sum g * xhat,
              dx = w * invstd * (g - db / M - xhat * dw / M)        (M = rows)
— the same formulas as ``torch.native_batch_norm(_backward)``, with x recomputed from the saved codes.

A convolution's float output goes to batch norm as it is (``batch_norm_forward_float_rows``): the statistics
come from the exact values, and the pass that writes the int8 codes batch norm saves for backward also yields
the output's ReLU amax without reading the output again: per channel ``y = (x - mean) * k + b`` is monotone in
``x``, so ``max relu(y)`` is attained at the channel's smallest or largest input.
"""

from __future__ import annotations

import torch

from ..numerics.quantize import round_and_clamp, scale_from_amax
from ..spec import IntFormat, Rounding
from . import native, ops
from .fused import run_fused, column_amax, column_sum

__all__ = [
    "dequantize_rows", "relu_grad", "batch_norm_forward_rows", "batch_norm_forward_float_rows", "batch_norm_backward_rows", "relu_quantize_rows",
    "add_rows",
]

_ZP = 128


def _dequantize_impl(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (codes.to(torch.float32) - _ZP) * scale


def dequantize_rows(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``scale * (codes - 128)`` as float32 (``scale`` broadcasts over the rows)."""
    return run_fused(_dequantize_impl, {"codes": codes, "scale": scale}, {})


def _relu_grad_impl(codes: torch.Tensor, g: torch.Tensor, signed: bool) -> torch.Tensor:
    # Widen before comparing: inductor's uint8 comparison does not vectorise (11 ms vs 0.7 ms per 1M here).
    if signed:
        return torch.where(torch.bitwise_xor(codes, _ZP).view(torch.int8).to(torch.int32) > 0, g, torch.zeros_like(g))
    return torch.where(codes.to(torch.int32) > _ZP, g, torch.zeros_like(g))


def relu_grad(codes: torch.Tensor, g: torch.Tensor, signed: bool = False) -> torch.Tensor:
    """ReLU backward from the output codes: ``g`` where the code is positive, else 0.

    ``signed=True`` reads the mask from the signed codes (``code ^ 128`` as int8), the very tensor an int8 Linear
    consuming these codes saves for its weight gradient: a compiled graph then saves that one tensor and derives
    the mask in backward, instead of also saving a bool mask, whose store Inductor does not vectorise (measured:
    an MLP step with int8 dataflow, 58.8 -> 32.9 ms at 1 thread).  A convolution saves the uint8 codes as they are.
    """
    return run_fused(_relu_grad_impl, {"codes": codes, "g": g}, {"signed": signed})


def _bn_forward_impl(codes, scale, weight, bias, eps: float):
    x = (codes.to(torch.float32) - _ZP) * scale
    m = x.shape[0]
    mean = column_sum(x) / m
    var = column_sum((x - mean).square()) / m
    invstd = torch.rsqrt(var + eps)
    y = (x - mean) * (invstd * weight) + bias
    return y, mean, var, invstd


def batch_norm_forward_rows(codes, scale, weight, bias, eps: float):
    """Training batch norm of int8 rows: ``(y, mean, biased var, invstd)``."""
    return run_fused(_bn_forward_impl, {"codes": codes, "scale": scale, "weight": weight, "bias": bias},
                {"eps": float(eps)})


def _bn_forward_float_impl(x, weight, bias, eps: float, fmt: IntFormat):
    x = x.to(torch.float32)
    m = x.shape[0]
    mean = column_sum(x) / m
    hi, lo = column_amax(x).reshape(-1), -column_amax(-x).reshape(-1)  # one pass with the sum when compiled
    var = column_sum((x - mean).square()) / m
    invstd = torch.rsqrt(var + eps)
    k = invstd * weight
    y = (x - mean) * k + bias
    ends = torch.maximum((hi - mean) * k + bias, (lo - mean) * k + bias)  # y's largest value per channel
    relu_amax = ends.clamp_min(0).amax().reshape(1)  # NaN/inf in x propagate here (min/max/mean keep them)
    scale = scale_from_amax(torch.maximum(hi, -lo), fmt)  # = the per-channel absmax scale of x
    codes = (round_and_clamp(x / scale, fmt, Rounding.NEAREST_EVEN) + _ZP).to(torch.uint8)
    return codes, scale, y, mean, var, invstd, relu_amax


def batch_norm_forward_float_rows(x, weight, bias, eps: float, bits: int = 8):
    """Training batch norm of float rows that also quantizes its input for backward.

    Returns ``(codes, scale, y, mean, biased var, invstd, relu_amax)``: the input's per-channel int8 codes
    (uint8 = code + 128) and scales -- what :func:`batch_norm_backward_rows` recomputes the input from --, the
    float output, the statistics, and ``max(relu(y))`` (``[1]``) from the per-channel extremes of ``x``: a ReLU
    after it quantizes without an amax pass over ``y`` (equal to that pass up to float rounding).
    """
    return run_fused(_bn_forward_float_impl, {"x": x, "weight": weight, "bias": bias},
                {"eps": float(eps), "fmt": IntFormat(bits)})


def _bn_backward_impl(codes, scale, g, mean, invstd, weight):
    xhat = ((codes.to(torch.float32) - _ZP) * scale - mean) * invstd
    m = g.shape[0]
    db = column_sum(g)
    dw = column_sum(g * xhat)
    dx = (weight * invstd) * (g - db / m - xhat * (dw / m))
    return dx, dw, db


def batch_norm_backward_rows(codes, scale, g, mean, invstd, weight):
    """Training batch-norm backward with the input recomputed from its codes: ``(dx, dweight, dbias)``.

    On the CPU the native kernel serves (``native/batch_norm.c``: Inductor's uint8 loads are slow on AVX2),
    equal to the compiled pass up to float summation order."""
    if codes.device.type == "cpu" and native.batch_norm_available():
        per_channel = [t.reshape(-1).expand(g.shape[1]).contiguous() for t in (scale, mean, invstd, weight)]
        return ops.batch_norm_backward_u8(codes, per_channel[0], g, *per_channel[1:])  # (a per-tensor scale too)
    return run_fused(_bn_backward_impl, {"codes": codes, "scale": scale, "g": g, "mean": mean, "invstd": invstd,
                                    "weight": weight}, {})


def _relu_quantize_impl(x: torch.Tensor, fmt: IntFormat):
    x = torch.relu(x.to(torch.float32))
    scale = scale_from_amax(x.amax().reshape(1), fmt)
    codes = round_and_clamp(x / scale, fmt, Rounding.NEAREST_EVEN) + _ZP
    return codes.to(torch.uint8), scale


def _relu_quantize_known_impl(x: torch.Tensor, amax: torch.Tensor, fmt: IntFormat):
    scale = scale_from_amax(amax, fmt)
    codes = round_and_clamp(torch.relu(x.to(torch.float32)) / scale, fmt, Rounding.NEAREST_EVEN) + _ZP
    return codes.to(torch.uint8), scale


def relu_quantize_rows(x: torch.Tensor, bits: int = 8,
                       amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ReLU then per-tensor absmax quantization to ``bits``, round-half-even: ``(uint8 codes + 128, scale)``.

    ``amax`` (``[1]``), when the producer already knows ``max(relu(x))``, saves the amax pass."""
    if amax is not None:
        return run_fused(_relu_quantize_known_impl, {"x": x, "amax": amax}, {"fmt": IntFormat(bits)})
    return run_fused(_relu_quantize_impl, {"x": x}, {"fmt": IntFormat(bits)})


def _add_impl(a: torch.Tensor, b_codes: torch.Tensor, b_scale: torch.Tensor) -> torch.Tensor:
    return a.to(torch.float32) + (b_codes.to(torch.float32) - _ZP) * b_scale


def add_rows(a: torch.Tensor, b_codes: torch.Tensor, b_scale: torch.Tensor) -> torch.Tensor:
    """``a + scale * (codes - 128)`` in float32: a float operand plus an int8 one, one pass."""
    return run_fused(_add_impl, {"a": a, "b_codes": b_codes, "b_scale": b_scale}, {})
