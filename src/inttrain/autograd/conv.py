"""Integer training of ``y = conv2d(x, W) + b``: one autograd Function, three integer convolutions.

    forward       y  = x (*) W                      lhs x  per tensor,  rhs W  per output channel
    grad_input    dx = dy (*)^T W  (transposed conv)   lhs dy per tensor,  rhs W  per input channel
    grad_weight   dW = sum_{n,h,w} dy x             lhs dy per output channel, rhs x per tensor
    grad_bias     db = sum_{n,h,w} dy   (float)

Only the scale layouts that factor out of the integer sums are allowed: an activation's scale
cannot vary along the reduction (input channels x kernel window), so activations and gradients
entering a convolution's reduction are quantized per tensor.  Tensors are kept channels-last,
the layout of oneDNN's int8 convolution; the activation is quantized for the weight-gradient
convolution already in forward, so backward keeps its int8 codes instead of the float input.

A GEMM with codes wider than 8 bits (9..16, int16 storage) runs on :mod:`inttrain.kernels.conv_wide`: the
int16 codes split into exact int8 halves, each pair of halves one int8 convolution on the same kernels (exact,
two to four times the int8 work), or, for codes that are an int8 code times a constant plus an offset (DoReFa's
unsigned activations and odd weights and gradients), one int8 convolution and two small exact corrections.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ..kernels import ops as conv_kernels  # eager kernels, or graph nodes when compiling
from ..kernels.conv import ConvGeometry
from ..kernels.fused import channel_amax, matrix_scale, quantize_matrix
from ..numerics.hashing import SeedPurpose, derive_seed
from ..numerics.quantize import check_finite, is_finite
from ..spec import LayerPrecision, PerChannel, PerTensor, QuantSpec, Rounding, UnsupportedFormatError
from ..spec.capabilities import conv_layout_problem
from .seeds import save_with_seeds, saved_and_seeds
from .qactivation import DeferredQuant, QActivation, output_dtype, quantize_rows_of, rows_view

__all__ = ["int_conv2d", "ConvGeometry", "check_conv_precision"]

_CL = torch.channels_last


def check_conv_precision(prec: LayerPrecision) -> None:
    """Raise UnsupportedFormatError if ``prec`` asks for a layout the convolution GEMMs cannot serve
    (:mod:`inttrain.spec.capabilities`)."""
    problem = conv_layout_problem(prec)
    if problem is not None:
        raise UnsupportedFormatError(problem)


def _wide(g) -> bool:
    """An integer GEMM with codes past 8 bits: the int16-split path (:mod:`inttrain.kernels.conv_wide`)."""
    return g.integer and max(g.lhs.bits, g.rhs.bits) > 8


def _quantize_activation(x: torch.Tensor, spec: QuantSpec, seed: int, per_channel: bool = False,
                         zero_point: int = 0, column_amax: torch.Tensor | None = None):
    """Quantize a 4-D NCHW tensor via its channels-last [N*H*W, C] view; codes come back channels-last.

    ``per_channel`` gives one scale per channel C (shape [C]); otherwise one scale (shape [1]).
    ``zero_point=128`` emits the shifted uint8 codes oneDNN's int8 convolution consumes.  ``column_amax``: the
    view's per-channel amax when the caller has it.
    """
    if not per_channel:
        spec = dataclasses.replace(spec, granularity=PerTensor())
    codes, scale = quantize_rows_of(x, spec, seed=seed, zero_point=zero_point, column_amax=column_amax)
    return codes, scale.reshape(-1)


def _per_sample(spec: QuantSpec) -> bool:
    """One scale per sample (``PerChannel(0)`` of NCHW; see ``spec.capabilities.CONV_PER_SAMPLE``)."""
    return spec.granularity == PerChannel(0)


def _quantize_per_sample(x: torch.Tensor, spec: QuantSpec, seed: int, zero_point: int = 0):
    """Quantize a 4-D NCHW tensor with one scale per sample, via the ``[N, H*W*C]`` view of its channels-last
    layout; codes come back channels-last, the scale as ``[N]``."""
    x = x.contiguous(memory_format=_CL)
    n = x.shape[0]
    codes, scale = quantize_matrix(x.permute(0, 2, 3, 1).reshape(n, -1), spec, 0, seed=seed, zero_point=zero_point)
    return codes.reshape(n, x.shape[2], x.shape[3], x.shape[1]).permute(0, 3, 1, 2), scale.reshape(-1)


def _quantize_weight(w: torch.Tensor, spec: QuantSpec, seed: int, per_input_channel: bool, groups: int):
    """Quantize OIHW weights per output channel (or, for grad_input, per input channel / per tensor)."""
    if per_input_channel:
        if groups == 1 and isinstance(spec.granularity, PerChannel):
            cin = w.shape[1]
            rows = w.transpose(0, 1).reshape(cin, -1)
            codes, scale = quantize_matrix(rows, spec, 0, seed=seed)
            return codes.reshape(cin, w.shape[0], *w.shape[2:]).transpose(0, 1).contiguous(), scale.reshape(-1)
        spec = dataclasses.replace(spec, granularity=PerTensor())
    codes, scale = quantize_matrix(w.reshape(w.shape[0], -1), spec, 0, seed=seed)
    return codes.reshape(w.shape), scale.reshape(-1)


def _usable_codes(x, fwd) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (uint8 codes, scale) of an int8 input the forward GEMM can take unchanged, else None."""
    if not isinstance(x, QActivation) or not fwd.integer or x.per_channel or x.zero_point != 128:
        return None
    if x.bits != fwd.lhs.fmt.bits or not fwd.lhs.fmt.signed or not fwd.lhs.fmt.symmetric:
        return None
    return x.codes.contiguous(memory_format=_CL), x.scale


def _codes_in_kernel(spec: QuantSpec, dy: torch.Tensor) -> bool:
    """Whether the weight-gradient kernel can make ``spec``'s codes of ``dy`` itself (int8 codes of a
    symmetric signed format, nearest or stochastic rounding): the graph then computes only the scale."""
    fmt = spec.fmt
    return (fmt.signed and fmt.symmetric and fmt.bits <= 8 and dy.numel() > 0
            and spec.rounding in (Rounding.NEAREST_EVEN, Rounding.STOCHASTIC))


def _weight_grad(dyf: torch.Tensor, qx: torch.Tensor, sx: torch.Tensor, weight: torch.Tensor, geom: ConvGeometry,
                 gw, seed, dy_amax: torch.Tensor | None = None) -> torch.Tensor | None:
    """The integer weight gradient, or None when the output gradient is not finite (``dy_amax``: the channel
    amax of ``dyf``'s rows, when the caller has it)."""
    per_channel = isinstance(gw.lhs.granularity, PerChannel)
    if _codes_in_kernel(gw.lhs, dyf) and gw.rhs.bits <= 8:
        dyf = dyf.contiguous(memory_format=_CL)
        spec = gw.lhs if per_channel else dataclasses.replace(gw.lhs, granularity=PerTensor())
        sg = matrix_scale(rows_view(dyf), spec, 1, dy_amax).reshape(-1)
        if not is_finite(sg):
            return None
        return conv_kernels.conv2d_weight_grad_float(dyf, sg, gw.lhs.fmt.qmax, gw.lhs.rounding is Rounding.STOCHASTIC,
                                                     seed, qx, sx, tuple(weight.shape), geom)
    qg, sg = _quantize_activation(dyf, gw.lhs, seed, per_channel=per_channel, column_amax=dy_amax)
    if not is_finite(sg):
        return None
    # int16 output gradients (lhs) the int8 path splits itself; wide activations need the wide one
    wgrad = conv_kernels.conv_wide_weight_grad if gw.rhs.bits > 8 else conv_kernels.conv2d_weight_grad
    return wgrad(qg, sg, qx, sx, tuple(weight.shape), geom)


def _non_finite_grads(ctx, weight: torch.Tensor):
    """NaN gradients for every input that wants one (propagated, not raised: see ``linear.py``)."""
    nan = float("nan")
    dx = torch.full(ctx.x_shape, nan, dtype=ctx.x_dtype) if ctx.needs_input_grad[0] else None
    db = torch.full((weight.shape[0],), nan, dtype=weight.dtype) if ctx.has_bias else None
    return dx, torch.full_like(weight, nan), db, None, None, None, None, None


# allow_in_graph: Dynamo puts the Function in the graph without tracing its forward and backward itself
# (AOTAutograd still traces both): ~0.4 s less compile time per layer (ResNet-20: 19 -> 3 s of Dynamo tracing).
@torch.compiler.allow_in_graph
class _IntConv2dFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, geom: ConvGeometry, prec: LayerPrecision, seeds: tuple[int, int, int],
                grad_hook=None, emit_int8: bool = False):
        fwd, gw = prec.forward, prec.grad_weight
        # Dataflow: an int8 input whose format the forward GEMM takes as it is skips the quantize pass.
        x_codes = _usable_codes(x, fwd)
        xf = None  # the float input (bfloat16 under autocast: the quantizers read it as it is)
        if x_codes is None:
            xf = x.dequantize() if isinstance(x, QActivation) else x
        if fwd.integer:
            if x_codes is not None:
                qx, sx = x_codes
            elif _wide(fwd):  # signed int16 codes, no zero point
                qx, sx = _quantize_activation(xf, fwd.lhs, seeds[0])
                check_finite(sx, "conv2d input")
            else:
                qx, sx = _quantize_activation(xf, fwd.lhs, seeds[0], zero_point=128)  # uint8 q + 128
                check_finite(sx, "conv2d input")
            qw, sw = _quantize_weight(weight, fwd.rhs, derive_seed(seeds[0], SeedPurpose.RHS_OPERAND), False, geom.groups)
            check_finite(sw, "conv2d weight")
            if _wide(fwd):
                y = conv_kernels.conv_wide_forward(qx, sx, qw, sw, geom)
            else:  # under bf16 autocast the kernel rounds its output to bfloat16 itself (no float32 copy)
                direct = bias is None and not emit_int8 and output_dtype(x) == torch.bfloat16
                y = conv_kernels.conv2d_forward_u8(qx, sx, qw, sw, geom, torch.bfloat16 if direct else torch.float32)
        else:
            y = F.conv2d(xf.float(), weight.float(), None, geom.stride, geom.padding, geom.dilation, geom.groups)
        if bias is not None:
            y = y + bias.float().reshape(1, -1, 1, 1)
        ctx.x_is_codes = False
        if not ctx.needs_input_grad[1]:  # inference / frozen weight: no dW, nothing to keep
            save_with_seeds(ctx, seeds, weight)
        elif x_codes is not None and (not gw.integer or gw.rhs.fmt.bits == x.bits):
            # the int8 input *is* the activation: dW uses its codes (dequantized if dW runs in float)
            save_with_seeds(ctx, seeds, weight, *x_codes)
            ctx.x_is_codes = True
        elif gw.integer:
            if fwd.integer and x_codes is None and gw.rhs == fwd.lhs and gw.rhs.rounding is Rounding.NEAREST_EVEN:
                qx_gw, sx_gw = qx, sx  # same spec, deterministic rounding: reuse the forward (uint8) codes
            else:
                if xf is None:
                    xf = x.dequantize()
                qx_gw, sx_gw = _quantize_activation(xf, gw.rhs, derive_seed(seeds[2], SeedPurpose.RHS_OPERAND))
            save_with_seeds(ctx, seeds, weight, qx_gw, sx_gw)
        else:
            save_with_seeds(ctx, seeds, weight, xf.float())
        ctx.geom, ctx.prec, ctx.has_bias, ctx.grad_hook = geom, prec, bias is not None, grad_hook
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        if emit_int8:  # the consumer quantizes: batch norm saves per-channel codes of the exact values, a ReLU
            return DeferredQuant(y, 8)  # quantizes what survives it (see DeferredQuant)
        return y.to(output_dtype(x))

    @staticmethod
    def backward(ctx, dy):
        (weight, *saved), seeds = saved_and_seeds(ctx)
        geom, prec = ctx.geom, ctx.prec
        dyf = dy  # bfloat16 under autocast: the quantizers read it as it is, float paths upcast
        if ctx.grad_hook is not None:  # a recipe's transform of the output gradient (clip, noise) before quantizing
            dyf = ctx.grad_hook(dyf.float(), derive_seed(seeds[2], SeedPurpose.GRAD_HOOK))
        dx = dw = db = None
        gi, gw = prec.grad_input, prec.grad_weight
        dy_amax = None
        if ctx.needs_input_grad[0] and gi.integer and ctx.needs_input_grad[1] and gw.integer and dyf.numel():
            # both GEMMs quantize dy: one reduction gives the per-channel amax and, as its maximum, the per-tensor one
            dyf = dyf.contiguous(memory_format=_CL)
            dy_amax = channel_amax(rows_view(dyf))
        if ctx.needs_input_grad[0]:
            if gi.integer:
                zero_point = 0 if _wide(gi) else 128  # signed codes for the two-half GEMM, shifted for oneDNN
                if _per_sample(gi.lhs):  # the sample axis is not reduced: its scale factors out of dx
                    qg, sg = _quantize_per_sample(dyf, gi.lhs, seeds[1], zero_point=zero_point)
                else:
                    qg, sg = _quantize_activation(dyf, gi.lhs, seeds[1], zero_point=zero_point, column_amax=dy_amax)
                if not is_finite(sg):  # amax propagates inf/NaN: this tiny check covers all of dy
                    return _non_finite_grads(ctx, weight)
                qw, sw = _quantize_weight(weight, gi.rhs, derive_seed(seeds[1], SeedPurpose.RHS_OPERAND), True, geom.groups)
                conv_t = conv_kernels.conv_wide_input_grad if _wide(gi) else conv_kernels.conv2d_input_grad_u8
                dx = conv_t(qg, sg, qw, sw, tuple(ctx.x_shape), geom)
            else:
                dx = torch.nn.grad.conv2d_input(ctx.x_shape, weight.float(), dyf.float(), geom.stride, geom.padding,
                                                geom.dilation, geom.groups)
            dx = dx.to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            if gw.integer:
                dw = _weight_grad(dyf, *saved, weight, geom, gw, seeds[2], dy_amax)
                if dw is None:
                    return _non_finite_grads(ctx, weight)
            else:
                xf = QActivation(*saved).dequantize() if ctx.x_is_codes else saved[0]
                dw = torch.nn.grad.conv2d_weight(xf, weight.shape, dyf.float(), geom.stride, geom.padding,
                                                 geom.dilation, geom.groups)
            dw = dw.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dyf.sum((0, 2, 3), dtype=torch.float32).to(weight.dtype)
        return dx, dw, db, None, None, None, None, None


def int_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geom: ConvGeometry,
               prec: LayerPrecision, seeds: tuple[int, int, int] = (0, 0, 0), grad_hook=None,
               emit_int8: bool = False) -> torch.Tensor:
    """``F.conv2d`` with all three convolutions in integer arithmetic as configured by ``prec``.

    ``grad_hook(dy, seed) -> dy``, if given, transforms the float output gradient before it is quantized.
    ``x`` may be a :class:`QActivation` (its codes are used as they are when the forward GEMM's format
    allows); ``emit_int8=True`` returns the float output as a ``DeferredQuant`` its consumer quantizes (dataflow).
    """
    if x.dim() != 4:
        raise ValueError(f"conv2d expects a 4-D NCHW input, got shape {tuple(x.shape)}")
    if x.shape[1] != weight.shape[1] * geom.groups:
        raise ValueError(f"conv2d input has {x.shape[1]} channels, the layer expects {weight.shape[1] * geom.groups}")
    return _IntConv2dFn.apply(x, weight, bias, geom, prec, seeds, grad_hook, emit_int8)
