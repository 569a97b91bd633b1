"""Int8-in versions of the ops between integer layers, each an autograd Function.

Every op reads the codes of a :class:`~inttrain.autograd.qactivation.QActivation` and saves only int8
codes (or a 1-byte mask) for backward.  Most return a QActivation; batch norm and the residual add
return a :class:`~inttrain.autograd.qactivation.DeferredQuant` (float, not saved by anyone) that the
consuming ReLU quantizes after applying itself, so the int8 grid covers only what survives the ReLU.
A convolution hands batch norm its float output the same way: batch norm normalises the exact values
and saves their per-channel int8 codes, written in the pass that also finds the ReLU's amax.
Gradients between layers stay float32 (autograd sums them where branches meet); each integer layer
quantizes the gradient it consumes for its own GEMMs.

Exactness (value = scale * code):
    relu, max_pool2d, flatten, dropout   exact: the same codes (dropout divides the scale by 1 - p)
    views, reshapes, transposes, splits  exact: the same codes rearranged
    relu6                                the bound 6 is rounded to the code grid: error <= scale / 2
    gelu                                 scale from the input's possible values: error <= out_scale / 2
    avg_pool2d, adaptive_avg_pool2d      the window mean of the codes, rounded half-even: <= scale / 2
    batch_norm, add                      float on the exact (dequantized or convolution output) values;
                                         the consumer (ReLU) quantizes per tensor: <= out_scale / 2
    layer_norm                           input rounded to int8 per row (token), float output
    attention                            float softmax on exact q, k, v; output <= out_scale / 2
Backward formulas are the float ops' formulas evaluated on the values forward used, so a gradient
is exact for the quantized forward (batch norm and layer norm recompute their normalised input from
the saved codes; attention keeps its output in bfloat16 for backward).

The residual add's scale rule: the two operands may carry very different scales (a shortcut and a
main branch); the sum is formed from both exact values and given one new scale ``amax / 127`` by its
consumer, so neither operand is first squeezed onto the other's grid.  In backward the add passes its
float output gradient to both branches unchanged, and autograd adds the branch gradients in float, so
the gradient arriving at the block input has no scale to lose.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd import Function

from ..kernels import dataflow_passes as passes
from ..kernels.fused import quantize_matrix
from ..numerics.quantize import check_finite
from ..spec import IntFormat, PerChannel, QuantSpec
from .qactivation import (DEFERRED_OPS, INT8_OPS, DeferredQuant, QActivation, from_rows, quantize_activation, to_float,
                          rows_view)

__all__ = ["to_float", "int8_relu", "int8_add", "int8_batch_norm"]

_CL = torch.channels_last
_ROW_SPEC = QuantSpec(IntFormat(8), PerChannel(0))  # LayerNorm input: one scale per row (token)


def _codes_like(x: QActivation, codes: torch.Tensor, scale: torch.Tensor | None = None) -> QActivation:
    return QActivation(codes, x.scale if scale is None else scale, x.zero_point, x.bits)


def _code_max(x: QActivation) -> int:
    return x.zero_point + (1 << (x.bits - 1)) - 1


def _code_min(x: QActivation) -> int:
    return x.zero_point - (1 << (x.bits - 1)) + 1


def _empty_like_shape(shape, ref: torch.Tensor) -> torch.Tensor:
    """An uninitialised float32 tensor: the pooling backward kernels read only its size and layout."""
    fmt = _CL if len(shape) == 4 else torch.contiguous_format
    return torch.empty(shape, dtype=torch.float32, device=ref.device, memory_format=fmt)


def _rows_of(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` (same shape as ``like``) as rows in ``like``'s layout, copying only if its layout differs."""
    if t.dim() == 4:
        t = t.contiguous(memory_format=_CL)
    elif t.dim() == 2:
        t = t.contiguous()
    return rows_view(t)


# ----------------------------------------------------------------------------- boundary


# ----------------------------------------------------------------------------- relu / relu6


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _ReLU(Function):
    @staticmethod
    def forward(ctx, x: QActivation):
        out = torch.clamp_min(x.codes, x.zero_point)
        ctx.save_for_backward(out)  # the mask is out > zero point; storage shared with the consumer's save
        ctx.zp = x.zero_point
        return _codes_like(x, out)

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return _relu_backward(out, g, ctx.zp)


def _relu_backward(codes: torch.Tensor, g: torch.Tensor, zp: int) -> torch.Tensor:
    rows = rows_view(codes)
    if zp == 128 and rows is not None:
        # 2-D codes feed a Linear (which saves them as signed int8); 4-D ones a convolution (which saves uint8)
        return from_rows(passes.relu_grad(rows, _rows_of(g, codes), signed=codes.dim() == 2), codes.shape)
    return torch.where(codes > zp, g, 0.0)


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _ReLU6(Function):
    @staticmethod
    def forward(ctx, x: QActivation):
        top = torch.clamp(torch.round(6.0 / x.scale_view()) + x.zero_point, max=_code_max(x))
        out = torch.minimum(torch.clamp_min(x.codes, x.zero_point), top.to(x.codes.dtype))
        ctx.save_for_backward(x.codes, x.scale)
        ctx.zp = x.zero_point
        return _codes_like(x, out)

    @staticmethod
    def backward(ctx, g):
        codes, scale = ctx.saved_tensors
        value = QActivation(codes, scale, ctx.zp).dequantize()
        return torch.where((value > 0) & (value < 6), g, 0.0)


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _ReLUQuantize(Function):
    """ReLU of a float (batch-norm) output, quantized after the ReLU: the scale covers only what survives."""

    @staticmethod
    def forward(ctx, x, bits: int):
        with torch._C.DisableTorchFunctionSubclass():
            rows = rows_view(x)
            if rows is not None:
                codes, scale = passes.relu_quantize_rows(rows, bits, x.relu_amax)
                check_finite(scale, "relu output")
                out = QActivation(from_rows(codes, x.shape), scale, 128, bits)
            else:
                out = quantize_activation(torch.relu(x), per_channel=False, bits=bits, name="relu output")
        ctx.save_for_backward(out.codes)
        ctx.zp = out.zero_point
        return out

    @staticmethod
    def backward(ctx, g):
        (codes,) = ctx.saved_tensors
        # The float input was > 0 exactly where the output is; values that rounded to code 0 pass no
        # gradient, as if the ReLU had cut them (they are within half a step of 0).
        return _relu_backward(codes, g, ctx.zp), None


def int8_relu(x: torch.Tensor, inplace: bool = False):
    if isinstance(x, DeferredQuant):
        return _ReLUQuantize.apply(x, x.bits)
    if not isinstance(x, QActivation):
        return NotImplemented
    return _ReLU.apply(x)


def _relu6(x, inplace: bool = False):
    if not isinstance(x, QActivation):
        return NotImplemented
    return _ReLU6.apply(x)


# ----------------------------------------------------------------------------- gelu


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _GELU(Function):
    """GELU on int8 codes, output int8 codes with a scale known before the data is read.

    A per-tensor input has few possible values (255 at 8 bits: codes -127..127), so the largest |gelu| over
    its code range -- hence the output scale ``amax / qmax`` -- comes from a table of those values, and one
    pass over the data writes the output codes ``round(gelu(value) / out_scale)`` (no amax pass; the next
    Linear consumes the codes as they are).  Backward is the float op's backward on the same values.  Saves
    the uint8 input codes.
    Per element the GELU is computed, not gathered from the table: a compiled graph would otherwise
    inline the table's computation into the gather."""

    @staticmethod
    def forward(ctx, x: QActivation, approximate: str):
        qmax = (1 << (x.bits - 1)) - 1
        lo, hi = _code_min(x) - x.zero_point, _code_max(x) - x.zero_point
        table = F.gelu(torch.arange(lo, hi + 1, dtype=torch.float32, device=x.codes.device) * x.scale,
                       approximate=approximate)
        amax = table.abs().amax()
        out_scale = torch.where(amax == 0, torch.ones_like(amax), amax / qmax).reshape(1)
        with torch._C.DisableTorchFunctionSubclass():
            y = F.gelu(x.dequantize(), approximate=approximate)
        codes = (torch.round(y / out_scale).clamp(-qmax, qmax) + 128).to(torch.uint8)
        ctx.save_for_backward(x.codes, x.scale)
        ctx.approximate = approximate
        return QActivation(codes, out_scale, 128, x.bits)

    @staticmethod
    def backward(ctx, g):
        codes, scale = ctx.saved_tensors
        values = QActivation(codes, scale, 128).dequantize()
        return torch.ops.aten.gelu_backward(g, values, approximate=ctx.approximate), None


def _gelu(x, approximate: str = "none"):
    if not isinstance(x, QActivation) or x.per_channel or x.zero_point != 128:
        return NotImplemented
    return _GELU.apply(x, approximate)


# ----------------------------------------------------------------------------- pooling


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _MaxPool2d(Function):
    @staticmethod
    def forward(ctx, x: QActivation, kernel_size, stride, padding, dilation, ceil_mode):
        # uint8 codes are monotonic in the values, so the max (and its position, ties included) is exact.
        # torch 2.13's uint8 channels-last max-pool kernel fails at 14x14 and up ("Expected input_depth *
        # input_height * input_width <= ..."): pool NCHW-contiguous codes, hand the layout back unchanged.
        out = F.max_pool2d(_poolable(x.codes), kernel_size, stride, padding, dilation, ceil_mode).to(x.codes.dtype)
        if x.codes.is_contiguous(memory_format=torch.channels_last) and not x.codes.is_contiguous():
            out = out.contiguous(memory_format=torch.channels_last)
        ctx.save_for_backward(x.codes)  # indices recomputed in backward: int64 indices would cost 8 bytes each
        ctx.args = (kernel_size, stride, padding, dilation, ceil_mode)
        return _codes_like(x, out)

    @staticmethod
    def backward(ctx, g):
        (codes,) = ctx.saved_tensors
        k, s, p, d, c = ctx.args
        _, idx = torch.ops.aten.max_pool2d_with_indices(_poolable(codes), k, s, p, d, c)
        dx = torch.ops.aten.max_pool2d_with_indices_backward(g, _empty_like_shape(codes.shape, g), k, s, p, d, c, idx)
        return dx, None, None, None, None, None


def _nchw(codes: torch.Tensor) -> torch.Tensor:
    return codes if codes.is_contiguous() else codes.contiguous()


def _poolable(codes: torch.Tensor) -> torch.Tensor:
    """NCHW codes a max-pool kernel takes: uint8 on the CPU; on CUDA, which has no integer max-pool, float16
    (every uint8 value is exact in it, so the max and its position are the same)."""
    codes = _nchw(codes)
    return codes if codes.device.type == "cpu" else codes.to(torch.float16)


def _max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    if not isinstance(x, QActivation) or return_indices or x.dim() != 4:
        return NotImplemented
    stride = kernel_size if stride is None or stride == [] else stride
    return _MaxPool2d.apply(x, _pair(kernel_size), _pair(stride), _pair(padding), _pair(dilation), ceil_mode)


def _pair(v) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(e) for e in v]


def _round_codes(mean_codes: torch.Tensor, x: QActivation) -> torch.Tensor:
    return torch.round(mean_codes).clamp_(_code_min(x), _code_max(x)).to(x.codes.dtype)


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _AvgPool2d(Function):
    @staticmethod
    def forward(ctx, x: QActivation, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        # Padding counts as value 0, which is code zero_point: pool the signed codes.
        signed = x.codes.to(torch.float32) - x.zero_point
        mean = F.avg_pool2d(signed, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        ctx.args = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        ctx.x_shape = x.shape
        return _codes_like(x, _round_codes(mean + x.zero_point, x))

    @staticmethod
    def backward(ctx, g):
        dx = torch.ops.aten.avg_pool2d_backward(g, _empty_like_shape(ctx.x_shape, g), *ctx.args)
        return dx, None, None, None, None, None, None


def _avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    if not isinstance(x, QActivation) or x.dim() != 4:
        return NotImplemented
    stride = kernel_size if stride is None or stride == [] else stride
    return _AvgPool2d.apply(x, _pair(kernel_size), _pair(stride), _pair(padding), ceil_mode, count_include_pad,
                            divisor_override)


def _adaptive_avg_pool2d(x, output_size):
    """Served when the output divides the input (then it is an avg_pool2d with kernel = stride)."""
    if not isinstance(x, QActivation) or x.dim() != 4:
        return NotImplemented
    h, w = x.shape[-2:]
    oh, ow = _pair(output_size) if not isinstance(output_size, int) else (output_size, output_size)
    oh, ow = oh or h, ow or w
    if h % oh or w % ow:
        return NotImplemented
    k = [h // oh, w // ow]
    return _AvgPool2d.apply(x, k, k, [0, 0], False, True, None)


# ----------------------------------------------------------------------------- flatten / dropout


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _Reshape(Function):
    @staticmethod
    def forward(ctx, x: QActivation, start_dim: int, end_dim: int):
        ctx.x_shape = x.shape
        return _codes_like(x, torch.flatten(x.codes, start_dim, end_dim))

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.x_shape), None, None


def _flatten(x, start_dim: int = 0, end_dim: int = -1):
    if not isinstance(x, QActivation) or x.per_channel and start_dim <= 1 <= (end_dim % x.dim()) and x.dim() > 1:
        return NotImplemented  # a per-channel scale cannot follow channels merged with other dims
    return _Reshape.apply(x, start_dim, end_dim)


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _Dropout(Function):
    @staticmethod
    def forward(ctx, x: QActivation, p: float):
        keep = torch.rand(x.shape, device=x.device) >= p  # drawn from torch's generator, as F.dropout does
        ctx.save_for_backward(keep)
        ctx.factor = 1.0 / (1.0 - p)
        codes = torch.where(keep, x.codes, torch.tensor(x.zero_point, dtype=x.codes.dtype, device=x.device))
        return _codes_like(x, codes, x.scale * ctx.factor)  # exact: the rescale moves into the scale

    @staticmethod
    def backward(ctx, g):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, g * ctx.factor, 0.0), None


def _dropout(x, p: float = 0.5, training: bool = True, inplace: bool = False):
    if not isinstance(x, QActivation):
        return NotImplemented
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return NotImplemented
    return _Dropout.apply(x, float(p))


# ----------------------------------------------------------------------------- batch norm


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _BatchNorm(Function):
    """Training batch norm that saves its input as int8 codes.  An int8 input (QActivation) is normalised as
    its codes' values; a float one (a convolution's DeferredQuant output) as its exact values, and the pass
    over it writes the per-channel int8 codes backward recomputes it from, and the ReLU amax of the output."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
        c = x.shape[1]
        w = weight if weight is not None else torch.ones(c, device=x.device)
        b = bias if bias is not None else torch.zeros(c, device=x.device)
        relu_amax = None
        if isinstance(x, DeferredQuant):  # int8_batch_norm routes only training rows here
            rows = _rows_of(x.inner, x.inner)
            codes_rows, scale, y, mean, var, invstd, relu_amax = passes.batch_norm_forward_float_rows(
                rows, w, b, eps, x.bits)
            codes, zp, fused = from_rows(codes_rows, x.shape), 128, True
        else:
            rows = rows_view(x.codes)
            codes, scale, zp = x.codes, x.scale, x.zero_point
            fused = training and rows is not None and x.zero_point == 128
            if fused:
                y, mean, var, invstd = passes.batch_norm_forward_rows(rows, x.scale, w, b, eps)
        if fused:
            if running_mean is not None:  # torch's update: the running variance is unbiased
                m = rows.shape[0]
                with torch.no_grad():
                    running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
                    running_var.mul_(1 - momentum).add_(var * (m / max(m - 1, 1)), alpha=momentum)
            y = from_rows(y, x.shape)
        else:
            y, mean, invstd = torch.native_batch_norm(x.dequantize(), weight, bias, running_mean, running_var,
                                                      training, momentum, eps)
        ctx.save_for_backward(codes, scale, w, mean, invstd, running_mean, running_var)
        ctx.zp, ctx.training, ctx.eps, ctx.fused, ctx.has_weight = zp, training, eps, fused, weight is not None
        return DeferredQuant(y, x.bits, relu_amax)  # quantized by its consumer (see DeferredQuant)

    @staticmethod
    def backward(ctx, g):
        codes, scale, weight, mean, invstd, running_mean, running_var = ctx.saved_tensors
        if ctx.fused:  # the normalised input is recomputed from the int8 codes inside the fused pass
            dx, dw, db = passes.batch_norm_backward_rows(rows_view(codes), scale, _rows_of(g, codes), mean, invstd,
                                                         weight)
            dx = from_rows(dx, codes.shape)
        else:
            xf = QActivation(codes, scale, ctx.zp).dequantize()
            mask = [ctx.needs_input_grad[0], ctx.has_weight and ctx.needs_input_grad[1], ctx.needs_input_grad[2]]
            dx, dw, db = torch.ops.aten.native_batch_norm_backward(
                g.contiguous(memory_format=_CL) if g.dim() == 4 else g, xf, weight, running_mean, running_var,
                mean, invstd, ctx.training, ctx.eps, mask)
        if not ctx.has_weight:
            dw = db = None
        return dx, dw, db, None, None, None, None, None


def int8_batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    if isinstance(x, DeferredQuant):  # a float input: fused in training on 2-D / 4-D rows, else torch's float op
        if not training or x.dim() not in (2, 4) or x.numel() <= x.shape[1]:
            return NotImplemented
    elif not isinstance(x, QActivation):
        return NotImplemented
    per_channel_values = x.shape[0] * (x.numel() // (x.shape[0] * x.shape[1]) if x.dim() > 2 else 1)
    if training and per_channel_values <= 1:
        return NotImplemented  # let torch raise its "more than 1 value per channel" error
    return _BatchNorm.apply(x, weight, bias, running_mean, running_var, training,
                            0.0 if momentum is None else momentum, eps)


# ----------------------------------------------------------------------------- views of the codes


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _CodesView(Function):
    """A rearrangement (view, reshape, transpose, permute, split, chunk) applied to the codes of a per-tensor
    QActivation: exact, no dequantize.  Backward applies the rearrangement's inverse to the gradient."""

    @staticmethod
    def forward(ctx, x: QActivation, method, args, kwargs):
        out = method(x.codes, *args, **kwargs)
        ctx.x_shape, ctx.method, ctx.args, ctx.kwargs = x.shape, method, args, kwargs
        ctx.multi = isinstance(out, (tuple, list))
        if ctx.multi:
            ctx.sizes = [o.shape for o in out]
            return tuple(_codes_like(x, o) for o in out)
        return _codes_like(x, out)

    @staticmethod
    def backward(ctx, *grads):
        m, args, kw = ctx.method, ctx.args, ctx.kwargs
        if m in (torch.Tensor.view, torch.Tensor.reshape, torch.Tensor.contiguous):
            dx = grads[0].reshape(ctx.x_shape)
        elif m is torch.Tensor.transpose:
            dx = grads[0].transpose(*args, **kw)
        elif m is torch.Tensor.permute:
            dims = args[0] if len(args) == 1 and not isinstance(args[0], int) else args
            dx = grads[0].permute(*[list(dims).index(i) for i in range(len(dims))])
        else:  # split / chunk: the pieces' gradients side by side (zeros for unused pieces)
            dim = kw.get("dim", args[1] if len(args) > 1 else 0)
            ref = next(g for g in grads if g is not None)
            parts = [g if g is not None else ref.new_zeros(size) for g, size in zip(grads, ctx.sizes)]
            dx = torch.cat(parts, dim)
        return dx, None, None, None


def _codes_view(method):
    def impl(x, *args, **kwargs):
        if not isinstance(x, QActivation) or x.per_channel:
            return NotImplemented  # a per-channel scale cannot follow its channels through a rearrangement
        if any(isinstance(a, torch.dtype) for a in (*args, *kwargs.values())):
            return NotImplemented  # view(dtype) reinterprets bits: not a rearrangement
        return _CodesView.apply(x, method, args, kwargs)

    return impl


# ----------------------------------------------------------------------------- layer norm


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _LayerNorm(Function):
    """LayerNorm over the last dim; the input is kept as int8 codes with one scale per row (token)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float):
        with torch._C.DisableTorchFunctionSubclass():
            xf = x.dequantize() if isinstance(x, QActivation) else x
            rows = xf.reshape(-1, xf.shape[-1]).float()
        codes, scale = quantize_matrix(rows, _ROW_SPEC, 0)
        check_finite(scale, "layer_norm input")
        xq = (codes.to(torch.float32) * scale).reshape(x.shape)  # the values forward normalises
        d = x.shape[-1]
        y, mean, rstd = torch.native_layer_norm(xq, [d], weight, bias, eps)
        ctx.save_for_backward(codes, scale, weight, bias, mean, rstd)
        ctx.x_shape = x.shape
        return y

    @staticmethod
    def backward(ctx, g):
        codes, scale, weight, bias, mean, rstd = ctx.saved_tensors
        xq = (codes.to(torch.float32) * scale).reshape(ctx.x_shape)
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1],
                bias is not None and ctx.needs_input_grad[2]]
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(g.contiguous(), xq, [ctx.x_shape[-1]], mean, rstd,
                                                               weight, bias, mask)
        return dx, dw, db, None


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    if not isinstance(x, (QActivation, DeferredQuant)) or len(tuple(normalized_shape)) != 1:
        return NotImplemented
    if isinstance(x, QActivation) and x.per_channel and x.dim() == 2:
        return NotImplemented
    return _LayerNorm.apply(x, weight, bias, eps)


# ----------------------------------------------------------------------------- attention



@torch.compiler.allow_in_graph  # see autograd/conv.py
class _Attention(Function):
    """Scaled dot-product attention on int8 q, k, v (CPU flash-attention kernel on their exact values).

    Saves the q, k, v codes, the output in bfloat16 and the float log-sum-exp per query row; the output
    goes on as int8 (the next Linear consumes and keeps those codes).  Backward runs the kernel's own
    backward on the saved values."""

    @staticmethod
    def forward(ctx, q: QActivation, k: QActivation, v: QActivation, is_causal: bool, scale):
        qf, kf, vf = q.dequantize(), k.dequantize(), v.dequantize()
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qf, kf, vf, 0.0, is_causal, scale=scale)
        # The kernel writes O [B, H, S, D] laid out as [B, S, H, D]: both per-tensor quantizations read it in
        # that memory order (a gather in the logical order is a scalar loop: ~5 ms per layer here), and the
        # codes keep the layout, so the model's transpose(1, 2).reshape(B, S, H*D) stays a view.
        o_mem = out.transpose(1, 2)
        flat = o_mem.reshape(1, -1)
        oq = quantize_activation(flat, per_channel=False, bits=q.bits, name="attention output")
        # Backward's rowsum(dO * O) term is sensitive to O's rounding (int8 O cost ~5 dB of gradient SQNR on
        # the qkv weights here): O is kept for it in bfloat16 (as bf16 autocast training keeps it), half of
        # float32.  (Int16 codes were as small, but their conversion is a scalar loop in compiled graphs.)
        o_bf16 = o_mem.to(torch.bfloat16)
        ctx.save_for_backward(q.codes, q.scale, k.codes, k.scale, v.codes, v.scale, o_bf16, lse)
        ctx.is_causal, ctx.scale_arg = is_causal, scale
        return QActivation(oq.codes.reshape(o_mem.shape).transpose(1, 2), oq.scale, oq.zero_point, oq.bits)

    @staticmethod
    def backward(ctx, g):
        qc, qs, kc, ks, vc, vs, o_bf16, lse = ctx.saved_tensors
        q, k, v = (QActivation(c, s).dequantize() for c, s in ((qc, qs), (kc, ks), (vc, vs)))
        o = o_bf16.to(torch.float32).transpose(1, 2)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g.contiguous(), q, k, v, o, lse, 0.0, ctx.is_causal, scale=ctx.scale_arg)
        return dq, dk, dv, None, None


def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    ok = all(isinstance(t, QActivation) and not t.per_channel and t.dim() == 4 and t.device.type == "cpu"
             for t in (query, key, value))
    if not ok or attn_mask is not None or dropout_p != 0.0 or enable_gqa or query.shape[1] != key.shape[1]:
        return NotImplemented
    return _Attention.apply(query, key, value, bool(is_causal), scale)


# ----------------------------------------------------------------------------- residual add


@torch.compiler.allow_in_graph  # see autograd/conv.py
class _Add(Function):
    @staticmethod
    def forward(ctx, a, b):
        bits = max(getattr(t, "bits", 0) for t in (a, b))
        with torch._C.DisableTorchFunctionSubclass():
            if isinstance(a, QActivation) and not isinstance(b, QActivation):
                a, b = b, a
            af = a.dequantize() if isinstance(a, QActivation) else a.float()
            rows_a = _rows_of(af, af)
            if isinstance(b, QActivation) and rows_a is not None and rows_view(b.codes) is not None:
                total = from_rows(passes.add_rows(rows_a, rows_view(b.codes), b.scale), af.shape)
            else:
                total = af + (b.dequantize() if isinstance(b, QActivation) else b.float())
            return DeferredQuant(total, bits)  # quantized by its consumer, usually the block's ReLU

    @staticmethod
    def backward(ctx, g):
        return g, g


def int8_add(a, b, *, alpha=1, out=None):
    """``a + b`` with at least one QActivation operand of the same shape; the sum gets a new scale."""
    if alpha != 1 or out is not None or not isinstance(b, torch.Tensor) or not isinstance(a, torch.Tensor):
        return NotImplemented
    if a.shape != b.shape or a.dtype != torch.float32 or b.dtype != torch.float32:
        return NotImplemented
    if not any(isinstance(t, (QActivation, DeferredQuant)) for t in (a, b)):
        return NotImplemented
    return _Add.apply(a, b)


def _radd(a, b):
    return int8_add(b, a)


def _register() -> None:
    table = {
        int8_relu: [F.relu, torch.relu, torch.Tensor.relu, torch.relu_, torch.Tensor.relu_],
        _relu6: [F.relu6],
        _gelu: [F.gelu],
        _max_pool2d: [F.max_pool2d],
        _avg_pool2d: [F.avg_pool2d],
        _adaptive_avg_pool2d: [F.adaptive_avg_pool2d],
        _flatten: [torch.flatten, torch.Tensor.flatten],
        _dropout: [F.dropout],
        int8_batch_norm: [F.batch_norm],
        int8_add: [torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__iadd__, torch.Tensor.add_],
        _radd: [torch.Tensor.__radd__],
        _layer_norm: [F.layer_norm],
        _attention: [F.scaled_dot_product_attention],
    }
    for method in (torch.Tensor.view, torch.Tensor.reshape, torch.Tensor.transpose, torch.Tensor.permute,
                   torch.Tensor.split, torch.Tensor.chunk, torch.Tensor.contiguous):
        table[_codes_view(method)] = [method]
    for fn, method in ((torch.reshape, torch.Tensor.reshape), (torch.transpose, torch.Tensor.transpose),
                       (torch.permute, torch.Tensor.permute), (torch.split, torch.Tensor.split),
                       (torch.chunk, torch.Tensor.chunk)):
        table[_codes_view(method)] = [fn]
    for impl, funcs in table.items():
        for f in funcs:
            INT8_OPS[f] = impl
    for impl in (int8_relu, int8_add, _radd, _layer_norm, int8_batch_norm):
        for f in table[impl]:
            DEFERRED_OPS[f] = impl


_register()
