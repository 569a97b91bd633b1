"""The integer kernels as ``torch.library`` custom operators, for compiled graphs.

``torch.compile`` cannot trace into the kernels' Python (oneDNN weight prepacking, chunking decisions that
read a scale with ``.item()``, launch counters) and should not: each kernel is one opaque node
``inttrain::<name>`` with a fake (meta) implementation giving its output's shape, dtype and strides, so
Inductor sees one graph and fuses the elementwise work (quantize, dequantize, bias, ReLU) around the nodes.
The real implementations are the eager kernels of :mod:`.matmul`, :mod:`.conv` and :mod:`.conv_wide`: they run, and count
themselves in :func:`inttrain.kernels.int_kernel_calls`, every time the compiled graph executes.

Eager code calls the kernels directly (it can reuse scratch buffers, which an operator returning a fresh
tensor cannot); compiled code calls these operators.  ``torch.library.opcheck`` tests the registrations.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..spec import PerChannel, QuantSpec, Rounding, ScaleKind
from . import conv as conv_kernels
from . import conv_wide, native
from ..oplib import operator
from .conv_geometry import ConvGeometry
from .counters import count
from .matmul import INT8_SAFE_K, int8_mm

__all__ = ["int8_mm_op", "conv2d_forward_u8", "conv2d_input_grad_u8", "conv2d_weight_grad",
           "conv_wide_forward", "conv_wide_input_grad", "conv_wide_weight_grad", "rows_cols_native",
           "quantize_rows_cols"]

_CL = torch.channels_last


def _geom(stride: list[int], padding: list[int], dilation: list[int], groups: int) -> ConvGeometry:
    return ConvGeometry(tuple(stride), tuple(padding), tuple(dilation), groups)


def _geom_args(geom: ConvGeometry) -> tuple:
    """A ConvGeometry as the operators' trailing ``stride, padding, dilation, groups`` arguments."""
    return list(geom.stride), list(geom.padding), list(geom.dilation), geom.groups


def _shape(size) -> list[int]:
    return [int(v) for v in size]


# ------------------------------------------------------------------------------------------ int8 GEMM


def _int8_mm_fake(a: Tensor, b: Tensor) -> Tensor:
    dtype = torch.int64 if a.shape[1] > INT8_SAFE_K else torch.int32
    return a.new_empty((a.shape[0], b.shape[1]), dtype=dtype)


@operator(
    "int8_mm(Tensor a, Tensor b) -> Tensor",
    _int8_mm_fake,
)
def _int8_mm(a: Tensor, b: Tensor) -> Tensor:
    """Exact ``a @ b`` of int8 matrices: int32, or int64 when the reduction is longer than INT8_SAFE_K."""
    return int8_mm(a, b).contiguous()  # CUDA's zero-padded result is a slice: hand back the fake's layout


def _int8_mm_dequant_fake(a: Tensor, b: Tensor, sa: Tensor, sb: Tensor) -> Tensor:
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.float32)


@operator(
    "int8_mm_dequant(Tensor a, Tensor b, Tensor sa, Tensor sb) -> Tensor",
    _int8_mm_dequant_fake,
)
def _int8_mm_dequant(a: Tensor, b: Tensor, sa: Tensor, sb: Tensor) -> Tensor:
    """:func:`inttrain.kernels.matmul.int_mm_dequant` on AMX (the only caller: it checks the operands)."""
    count("int8_mm")
    return native.int8_mm_amx_scaled(a, b, sa, sb)


def int8_mm_op(a: Tensor, b: Tensor) -> Tensor:
    """:func:`inttrain.kernels.matmul.int8_mm` as one graph node."""
    return torch.ops.inttrain.int8_mm(a, b)


# ------------------------------------------------------------------------------------------ convolution


def _out_len(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _conv_fwd_fake(xu8, x_scale, wq, w_scale, stride, padding, dilation, groups, bf16_out=False):
    n, _, h, w = xu8.shape
    ho = _out_len(h, wq.shape[2], stride[0], padding[0], dilation[0])
    wo = _out_len(w, wq.shape[3], stride[1], padding[1], dilation[1])
    dtype = torch.bfloat16 if bf16_out else torch.float32
    return xu8.new_empty((n, wq.shape[0], ho, wo), dtype=dtype).contiguous(memory_format=_CL)


@operator(
    "conv2d_forward_u8(Tensor xu8, Tensor x_scale, Tensor wq, Tensor w_scale, int[] stride, int[] padding, "
    "int[] dilation, int groups, bool bf16_out=False) -> Tensor",
    _conv_fwd_fake,
)
def _conv_fwd(xu8: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, stride: list[int], padding: list[int],
              dilation: list[int], groups: int, bf16_out: bool = False) -> Tensor:
    y = conv_kernels.conv2d_forward_u8(xu8, x_scale, wq, w_scale, _geom(stride, padding, dilation, groups),
                                       torch.bfloat16 if bf16_out else torch.float32)
    return y.contiguous(memory_format=_CL)


def conv2d_forward_u8(xu8: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, geom: ConvGeometry,
                      out_dtype: torch.dtype = torch.float32) -> Tensor:
    """:func:`inttrain.kernels.conv.conv2d_forward_u8`; one graph node when compiling (float32 or bfloat16,
    channels-last)."""
    if not torch.compiler.is_compiling():
        return conv_kernels.conv2d_forward_u8(xu8, x_scale, wq, w_scale, geom, out_dtype)
    return torch.ops.inttrain.conv2d_forward_u8(xu8, x_scale, wq, w_scale, *_geom_args(geom),
                                                bf16_out=out_dtype == torch.bfloat16)


_DGRAD_SIGNATURE = ("(Tensor gu8, Tensor g_scale, Tensor wq, Tensor w_scale, int[] input_shape, int[] stride, "
                    "int[] padding, int[] dilation, int groups, bool bf16_out=False) -> Tensor")


def _dgrad_operator(name: str, kernel, shape_of) -> None:
    """Register input-gradient kernel ``kernel`` as ``inttrain::name``; ``shape_of(input_shape, g_shape,
    w_shape, geom)`` gives its channels-last result's shape (float32, or bfloat16 with ``bf16_out``)."""

    def fake(gu8, g_scale, wq, w_scale, input_shape, stride, padding, dilation, groups, bf16_out=False):
        shape = shape_of(tuple(input_shape), tuple(gu8.shape), tuple(wq.shape), _geom(stride, padding, dilation, groups))
        dtype = torch.bfloat16 if bf16_out else torch.float32
        return gu8.new_empty(shape, dtype=dtype).contiguous(memory_format=_CL)

    @operator(name + _DGRAD_SIGNATURE, fake)
    def run(gu8: Tensor, g_scale: Tensor, wq: Tensor, w_scale: Tensor, input_shape: list[int], stride: list[int],
            padding: list[int], dilation: list[int], groups: int, bf16_out: bool = False) -> Tensor:
        out = kernel(gu8, g_scale, wq, w_scale, tuple(input_shape), _geom(stride, padding, dilation, groups),
                     torch.bfloat16 if bf16_out else torch.float32)
        return out.contiguous(memory_format=_CL)


_dgrad_operator("conv2d_input_grad_u8", conv_kernels.conv2d_input_grad_u8, lambda x_shape, g_shape, w_shape, geom: x_shape)
_dgrad_operator("conv2d_input_grad_phases_u8", conv_kernels.conv2d_input_grad_phases_u8,
                conv_kernels.input_grad_phases_shape)


def _per_sample_dgrad(dgrad, gq: Tensor, g_scale: Tensor, wq: Tensor, w_scale: Tensor, input_shape: tuple,
                      geom: ConvGeometry) -> Tensor:
    """``dgrad`` with one output-gradient scale per sample: run at scale 1, then each sample's scale multiplied in
    (the GEMM never sums across samples, so this is exact in the integer sum; compiled, Inductor fuses the multiply
    into the ops that read the gradient next)."""
    if g_scale.numel() != gq.shape[0]:
        raise ValueError(f"g_scale has {g_scale.numel()} elements; expected 1 or one per sample ({gq.shape[0]})")
    y = dgrad(gq, g_scale.new_ones(1), wq, w_scale, input_shape, geom)
    return y * g_scale.reshape(-1, 1, 1, 1).to(torch.float32)


def conv2d_input_grad_u8(gu8: Tensor, g_scale: Tensor, wq: Tensor, w_scale: Tensor, input_shape: tuple,
                         geom: ConvGeometry, out_dtype: torch.dtype = torch.float32) -> Tensor:
    """:func:`inttrain.kernels.conv.conv2d_input_grad_u8`; one graph node when compiling (channels-last).

    On the CPU the node is the sub-pixel convolution, and its depth-to-space stays in the graph as views, for
    Inductor to fold into the ops that read the gradient next (see :func:`.conv.phases_to_input_grad`).
    ``g_scale`` is one scale, or one per sample (``[N]``): the kernel then runs at scale 1 and the float32 result
    is multiplied by each sample's scale (exact in the integer sum; compiled, Inductor fuses the multiply into
    the ops that read the gradient next).
    """
    if g_scale.numel() > 1:
        return _per_sample_dgrad(conv2d_input_grad_u8, gu8, g_scale, wq, w_scale, input_shape, geom).to(out_dtype)
    bf16 = out_dtype == torch.bfloat16
    if not torch.compiler.is_compiling():
        return conv_kernels.conv2d_input_grad_u8(gu8, g_scale, wq, w_scale, input_shape, geom, out_dtype)
    if gu8.device.type != "cpu":
        return torch.ops.inttrain.conv2d_input_grad_u8(gu8, g_scale, wq, w_scale, _shape(input_shape),
                                                       *_geom_args(geom), bf16_out=bf16)
    y = torch.ops.inttrain.conv2d_input_grad_phases_u8(gu8, g_scale, wq, w_scale, _shape(input_shape),
                                                       *_geom_args(geom), bf16_out=bf16)
    return conv_kernels.phases_to_input_grad(y, _shape(input_shape), gu8.shape, wq.shape, geom)


def _conv_wgrad_fake(gq, g_scale, xq, x_scale, weight_shape, stride, padding, dilation, groups):
    return gq.new_empty(tuple(weight_shape), dtype=torch.float32)


@operator(
    "conv2d_weight_grad(Tensor gq, Tensor g_scale, Tensor xq, Tensor x_scale, int[] weight_shape, int[] stride, "
    "int[] padding, int[] dilation, int groups) -> Tensor",
    _conv_wgrad_fake,
)
def _conv_wgrad(gq: Tensor, g_scale: Tensor, xq: Tensor, x_scale: Tensor, weight_shape: list[int],
                stride: list[int], padding: list[int], dilation: list[int], groups: int) -> Tensor:
    dw = conv_kernels.conv2d_weight_grad(gq, g_scale, xq, x_scale, tuple(weight_shape),
                                         _geom(stride, padding, dilation, groups))
    return dw.contiguous()


def conv2d_weight_grad(gq: Tensor, g_scale: Tensor, xq: Tensor, x_scale: Tensor, weight_shape: tuple,
                       geom: ConvGeometry) -> Tensor:
    """:func:`inttrain.kernels.conv.conv2d_weight_grad`; one graph node when compiling (float32, contiguous)."""
    if not torch.compiler.is_compiling():
        return conv_kernels.conv2d_weight_grad(gq, g_scale, xq, x_scale, weight_shape, geom)
    return torch.ops.inttrain.conv2d_weight_grad(gq, g_scale, xq, x_scale, _shape(weight_shape), *_geom_args(geom))


# Wide codes (9..16 bits, int16): kernels.conv_wide, whose data-dependent choices (affine codes or int8 halves,
# chunks) and ctypes kernels stay behind one node each.

def _wide_dgrad_fake(gq, g_scale, wq, w_scale, input_shape, stride, padding, dilation, groups):
    return gq.new_empty(tuple(input_shape), dtype=torch.float32).contiguous(memory_format=_CL)


@operator(
    "conv_wide_forward(Tensor xq, Tensor x_scale, Tensor wq, Tensor w_scale, int[] stride, int[] padding, "
    "int[] dilation, int groups) -> Tensor",
    lambda xq, x_scale, wq, w_scale, stride, padding, dilation, groups: _conv_fwd_fake(
        xq, x_scale, wq, w_scale, stride, padding, dilation, groups),
)
def _conv_wide_fwd(xq: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, stride: list[int], padding: list[int],
                   dilation: list[int], groups: int) -> Tensor:
    y = conv_wide.conv2d_forward(xq, x_scale, wq, w_scale, _geom(stride, padding, dilation, groups))
    return y.contiguous(memory_format=_CL)


def _wide_grad_operator(name: str, operands: tuple[str, str], shape_name: str, kernel, fake, layout) -> None:
    """Register conv_wide's gradient ``kernel(a, a_scale, b, b_scale, shape, geom)`` as ``inttrain::name``."""
    a, b = operands
    schema = (f"{name}(Tensor {a}, Tensor {a}_scale, Tensor {b}, Tensor {b}_scale, int[] {shape_name}, "
              "int[] stride, int[] padding, int[] dilation, int groups) -> Tensor")

    @operator(schema, fake)
    def run(a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, shape: list[int], stride: list[int],
            padding: list[int], dilation: list[int], groups: int) -> Tensor:
        out = kernel(a, a_scale, b, b_scale, tuple(shape), _geom(stride, padding, dilation, groups))
        return out.contiguous(memory_format=layout)


_wide_grad_operator("conv_wide_input_grad", ("gq", "wq"), "input_shape", conv_wide.conv2d_input_grad,
                    _wide_dgrad_fake, _CL)
_wide_grad_operator("conv_wide_weight_grad", ("gq", "xq"), "weight_shape", conv_wide.conv2d_weight_grad,
                    _conv_wgrad_fake, torch.contiguous_format)


def _wide_call(eager, node, operands: tuple, shape: tuple | None, geom: ConvGeometry) -> Tensor:
    """``eager(*operands, [shape,] geom)`` in eager code, the operator ``node`` when compiling."""
    extra = () if shape is None else (shape,)
    if not torch.compiler.is_compiling():
        return eager(*operands, *extra, geom)
    return node(*operands, *(_shape(v) for v in extra), *_geom_args(geom))


def conv_wide_forward(xq: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, geom: ConvGeometry) -> Tensor:
    """:func:`inttrain.kernels.conv_wide.conv2d_forward`; one graph node when compiling (float32, channels-last)."""
    return _wide_call(conv_wide.conv2d_forward, torch.ops.inttrain.conv_wide_forward, (xq, x_scale, wq, w_scale),
                      None, geom)


def conv_wide_input_grad(gq: Tensor, g_scale: Tensor, wq: Tensor, w_scale: Tensor, input_shape: tuple,
                         geom: ConvGeometry) -> Tensor:
    """:func:`inttrain.kernels.conv_wide.conv2d_input_grad`; one graph node when compiling.  ``g_scale``: one
    scale, or one per sample (``[N]``), as :func:`conv2d_input_grad_u8`."""
    if g_scale.numel() > 1:
        return _per_sample_dgrad(conv_wide_input_grad, gq, g_scale, wq, w_scale, input_shape, geom)
    return _wide_call(conv_wide.conv2d_input_grad, torch.ops.inttrain.conv_wide_input_grad,
                      (gq, g_scale, wq, w_scale), input_shape, geom)


def conv_wide_weight_grad(gq: Tensor, g_scale: Tensor, xq: Tensor, x_scale: Tensor, weight_shape: tuple,
                          geom: ConvGeometry) -> Tensor:
    """:func:`inttrain.kernels.conv_wide.conv2d_weight_grad`; one graph node when compiling."""
    return _wide_call(conv_wide.conv2d_weight_grad, torch.ops.inttrain.conv_wide_weight_grad,
                      (gq, g_scale, xq, x_scale), weight_shape, geom)


def _conv_wgrad_float_fake(dy, g_scale, seed, xq, x_scale, weight_shape, stride, padding, dilation, groups, qmax, stochastic):
    return dy.new_empty(tuple(weight_shape), dtype=torch.float32)


@operator(
    "conv2d_weight_grad_float(Tensor dy, Tensor g_scale, Tensor seed, Tensor xq, Tensor x_scale, int[] weight_shape, "
    "int[] stride, int[] padding, int[] dilation, int groups, int qmax, bool stochastic) -> Tensor",
    _conv_wgrad_float_fake,
)
def _conv_wgrad_float(dy: Tensor, g_scale: Tensor, seed: Tensor, xq: Tensor, x_scale: Tensor, weight_shape: list[int],
                      stride: list[int], padding: list[int], dilation: list[int], groups: int, qmax: int,
                      stochastic: bool) -> Tensor:
    dw = conv_kernels.conv2d_weight_grad_float(dy, g_scale, qmax, stochastic, int(seed), xq, x_scale,
                                               tuple(weight_shape), _geom(stride, padding, dilation, groups))
    return dw.contiguous()


def conv2d_weight_grad_float(dy: Tensor, g_scale: Tensor, qmax: int, stochastic: bool, seed: int | Tensor, xq: Tensor,
                             x_scale: Tensor, weight_shape: tuple, geom: ConvGeometry) -> Tensor:
    """:func:`inttrain.kernels.conv.conv2d_weight_grad_float` (the gradient quantized inside the kernel); one
    graph node when compiling, with ``seed`` a 0-d int64 tensor there (float32, contiguous)."""
    if not torch.compiler.is_compiling():
        return conv_kernels.conv2d_weight_grad_float(dy, g_scale, qmax, stochastic, int(seed), xq, x_scale,
                                                     weight_shape, geom)
    seed_t = torch.as_tensor(seed, dtype=torch.int64, device=dy.device).reshape(())
    return torch.ops.inttrain.conv2d_weight_grad_float(dy, g_scale, seed_t, xq, x_scale, _shape(weight_shape),
                                                       *_geom_args(geom), qmax, stochastic)


# ------------------------------------------------------------------- output gradient quantized two ways

_MODES = {Rounding.NEAREST_EVEN: 1, Rounding.STOCHASTIC: 2}  # 0: that side is not wanted


def _native_spec(spec: QuantSpec | None) -> bool:
    """Whether the native quantizer computes ``spec`` exactly as :func:`.fused.quantize_matrix` does."""
    return spec is None or (
        spec.fmt.signed and spec.fmt.symmetric and spec.fmt.bits <= 8 and isinstance(spec.granularity, PerChannel)
        and spec.rounding in _MODES and spec.scale_kind is ScaleKind.FLOAT and spec.fixed_amax is None)


@torch.compiler.assume_constant_result
def _quantize_library_loaded() -> bool:
    """Load (building on first call) the native quantizer; a constant to dynamo, which cannot trace the lock."""
    return native.quantize_available()


def rows_cols_native(row_spec: QuantSpec | None, col_spec: QuantSpec | None, device: torch.device) -> bool:
    """Whether :func:`quantize_rows_cols` can serve these specs on ``device`` (builds the kernel on first call)."""
    if row_spec is None and col_spec is None or device.type != "cpu":
        return False
    if row_spec is not None and col_spec is not None and row_spec.fmt.qmax != col_spec.fmt.qmax:
        return False
    return _native_spec(row_spec) and _native_spec(col_spec) and _quantize_library_loaded()


def _quantize_rows_cols_fake(dy, row_mul, col_mul, seeds, qmax, mode_rows, mode_cols, col_sum):
    m, n = dy.shape
    i8 = torch.int8
    f32 = torch.float32
    return (dy.new_empty((m, n) if mode_rows else (0,), dtype=i8), dy.new_empty((m, 1) if mode_rows else (0,), dtype=f32),
            dy.new_empty((m, n) if mode_cols else (0,), dtype=i8), dy.new_empty((1, n) if mode_cols else (0,), dtype=f32),
            dy.new_empty((n,) if col_sum else (0,), dtype=f32))


@operator(
    "quantize_rows_cols(Tensor dy, Tensor? row_mul, Tensor? col_mul, Tensor seeds, int qmax, int mode_rows, "
    "int mode_cols, bool col_sum) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    _quantize_rows_cols_fake,
)
def _quantize_rows_cols(dy: Tensor, row_mul: Tensor | None, col_mul: Tensor | None, seeds: Tensor, qmax: int,
                        mode_rows: int, mode_cols: int, col_sum: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    seed_rows, seed_cols = (int(v) for v in seeds.tolist())
    out = native.quantize_rows_cols(
        dy, row_mul, col_mul, qmax, rows=mode_rows > 0, cols=mode_cols > 0, sr_rows=mode_rows == 2,
        seed_rows=seed_rows, sr_cols=mode_cols == 2, seed_cols=seed_cols, col_sum=col_sum)
    return tuple(t if t is not None else dy.new_empty((0,), dtype=torch.int8 if i in (0, 2) else torch.float32)
                 for i, t in enumerate(out))  # (fresh empties: outputs may not alias each other)


def quantize_rows_cols(dy: Tensor, row_mul: Tensor | None, col_mul: Tensor | None, row_spec: QuantSpec | None,
                       col_spec: QuantSpec | None, seed_rows: int | Tensor = 0, seed_cols: int | Tensor = 0,
                       col_sum: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Codes of ``dy * row_mul`` (one scale per row, ``row_spec``) and of ``dy * col_mul`` (one scale per
    column, ``col_spec``) in two passes over ``dy``: see ``native/quantize.c``; with ``col_sum``, also dy's
    column sums (a Linear's bias gradient, summed in double).  ``dy`` [M, N] float32 or bfloat16,
    ``row_mul`` [1, N] or [N], ``col_mul`` [M, 1] or [M] (or one value each).  A ``None`` spec skips that side (its outputs are
    empty when compiling, None in eager; likewise the sum without ``col_sum``).  Same codes and scales as :func:`.fused.quantize_matrix` bit for bit; call only when
    :func:`rows_cols_native`.  One graph node when compiling.
    """
    qmax = (row_spec or col_spec).fmt.qmax
    modes = [0 if spec is None else _MODES[spec.rounding] for spec in (row_spec, col_spec)]
    dy = dy if dy.dtype == torch.bfloat16 else dy.to(torch.float32)  # the kernel reads bfloat16 itself
    # one multiplier per feature / row; a per-tensor scale ([1, 1]) broadcasts
    row_mul, col_mul = (None if t is None else t.reshape(-1).float().expand(size).contiguous()
                        for t, size in ((row_mul, dy.shape[1]), (col_mul, dy.shape[0])))
    if not torch.compiler.is_compiling():  # eager: the kernel directly (a side not asked for comes back as None)
        return native.quantize_rows_cols(
            dy, row_mul, col_mul, qmax, rows=modes[0] > 0, cols=modes[1] > 0, sr_rows=modes[0] == 2,
            seed_rows=int(seed_rows), sr_cols=modes[1] == 2, seed_cols=int(seed_cols), col_sum=col_sum)
    seeds_t = torch.stack([torch.as_tensor(s, dtype=torch.int64, device=dy.device).reshape(())
                           for s in (seed_rows, seed_cols)])
    return torch.ops.inttrain.quantize_rows_cols(dy, row_mul, col_mul, seeds_t, qmax, *modes, col_sum)


# ------------------------------------------------------------------------------ batch norm from uint8 codes


def _batch_norm_backward_u8_fake(codes, scale, g, mean, invstd, weight):
    c = g.shape[1]
    return torch.empty_like(g), g.new_empty(c), g.new_empty(c)


@operator(
    "batch_norm_backward_u8(Tensor codes, Tensor scale, Tensor g, Tensor mean, Tensor invstd, Tensor weight) "
    "-> (Tensor, Tensor, Tensor)",
    _batch_norm_backward_u8_fake,
)
def _batch_norm_backward_u8(codes: Tensor, scale: Tensor, g: Tensor, mean: Tensor, invstd: Tensor,
                            weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return native.batch_norm_backward_u8(codes, scale, g, mean, invstd, weight)


def batch_norm_backward_u8(codes: Tensor, scale: Tensor, g: Tensor, mean: Tensor, invstd: Tensor,
                           weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Batch-norm backward from uint8 codes on the native kernel (``native/batch_norm.c``); one graph node when
    compiling.  Call only when ``native.batch_norm_available()`` and the tensors are on the CPU."""
    if not torch.compiler.is_compiling():
        return native.batch_norm_backward_u8(codes, scale, g, mean, invstd, weight)
    return torch.ops.inttrain.batch_norm_backward_u8(codes, scale, g, mean, invstd, weight)
