"""Exact int8 conv2d kernels for training: forward, input gradient, weight gradient.

Every product is int8 x int8 accumulated in int32 on an integer kernel; scales are
applied in the epilogue.  With unit scales the results equal ``float32(exact sum)``
bit for bit (see :mod:`inttrain.kernels.conv_reference`, the oracle).

Kernels
-------
* On CPU, forward and input gradient run on oneDNN's int8 convolution
  (``torch.ops.onednn.qconv_pointwise``, AMX / VNNI brgemm).  It only takes
  *unsigned* activations, so signed int8 codes go in as ``uint8 = int8 + 128``
  (a sign-bit flip) with zero point 128; oneDNN subtracts ``128 * sum(w)`` itself.
  The real scales are folded into the call (``x_scale`` and per-output-channel
  ``w_scales``), so there is no separate scaling pass.
* oneDNN applies that zero-point compensation after converting the int32
  accumulator to float32.  This is exact only while every accumulator value fits in
  24 bits; :func:`_qconv_exact` checks a bound computed from the weights and, when it
  could be exceeded, splits the input channels into chunks that are each safe and
  sums the chunks in float64.
* Without VNNI / AMX oneDNN's int8 convolution is not exact at all: its AVX2 kernels add
  uint8 x int8 product pairs in saturating int16 (``vpmaddubsw``).  A probe
  (:func:`onednn_int8_conv_exact`) finds out once; such CPUs take im2col + the exact int8 GEMM.
* The input gradient of a strided conv uses a sub-pixel decomposition: one conv of
  the gradient with an ``s*s``-phase weight, whose output channels are the phases,
  then one interleaving copy.  Zero-insertion would do ``s*s`` times more MACs.
* The weight gradient is a GEMM with a long reduction (N*Ho*Wo) and a small
  result.  Where the CPU has AVX512-VNNI it runs on :mod:`.native` (a C kernel
  that keeps a result tile in registers and reads the codes in place: 3-4x the
  library GEMMs below on ResNet-20's layers).  Otherwise on the machine's int8 GEMM
  (:func:`~inttrain.kernels.matmul.int8_gemm_kernel`: oneDNN's, AMX or AVX2), over the batch in chunks that stay in cache and that
  bound every int32 partial (see :func:`_batch_chunk`); the partials are summed
  in int64.  Stride 1 uses "shifted GEMMs" on a padded NHWC grid (no im2col);
  other strides use a per-chunk im2col.  :func:`conv2d_weight_grad_float` takes the float output
  gradient and a scale instead of codes: the native kernel rounds it (nearest or stochastic) while
  packing it, so no pass writes the codes.

Other devices (CUDA) take :mod:`.conv_generic`: im2col + ``torch._int_mm``, exact, slower.

``*_u8`` variants accept the already shifted uint8 codes: the activation / gradient
quantizer can emit ``q + 128`` as uint8 directly and save the shifting pass.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ..numerics.quantize import round_and_clamp, storage_dtype
from ..spec import IntFormat, Rounding
from . import conv_generic, native
from .conv_geometry import ConvGeometry
from .counters import count
from .fused import run_fused
from .matmul import int8_gemm_kernel

__all__ = [
    "ConvGeometry",
    "conv2d_forward",
    "conv2d_forward_u8",
    "conv2d_input_grad",
    "conv2d_input_grad_u8",
    "conv2d_input_grad_phases_u8",
    "input_grad_phases_shape",
    "phases_to_input_grad",
    "conv2d_weight_grad",
    "conv2d_weight_grad_float",
    "weight_grad_int",
    "to_shifted_u8",
]

_ZP = 128  # zero point of the shifted codes: uint8 = int8 + 128
_F32_EXACT = 1 << 24  # integers up to 2^24 are exact in float32
_INT32_MAX = (1 << 31) - 1
_MAX_PRODUCT = 128 * 128  # largest |int8 * int8|


# ----------------------------------------------------------------------------- helpers


def to_shifted_u8(q: Tensor) -> Tensor:
    """int8 codes -> uint8 ``q + 128`` in channels_last (what oneDNN's int8 conv takes).

    Flipping the sign bit of a two's-complement byte adds 128 exactly, so one XOR
    pass does the shift and the layout change together.
    """
    out = torch.empty(q.shape, dtype=torch.uint8, device=q.device, memory_format=torch.channels_last)
    torch.bitwise_xor(q.view(torch.uint8), _ZP, out=out)
    return out


def _channels_last_u8(xu8: Tensor) -> Tensor:
    return xu8.contiguous(memory_format=torch.channels_last)


def _scale_vector(scale: Tensor, n: int) -> Tensor:
    """A 1-element or length-n scale tensor as a contiguous float32 [n] vector."""
    s = scale.reshape(-1).to(torch.float32)
    if s.numel() not in (1, n):
        raise ValueError(f"scale has {s.numel()} elements, expected 1 or {n}")
    return s.expand(n).contiguous()


def _scalar(scale: Tensor) -> float:
    if scale.numel() != 1:
        raise ValueError("activation / gradient scale must have one element")
    return float(scale.reshape(()).item())


def _on_cpu(*tensors: Tensor) -> bool:
    # oneDNN's int8 convolution and these buffers are CPU-only; other devices take the
    # device-generic im2col + torch._int_mm path (conv_generic).
    return all(t.device.type == "cpu" for t in tensors)


def _out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


# ------------------------------------------------------------------ oneDNN int8 conv


def _qconv_raw(
    xu8: Tensor, x_scale: float, wq: Tensor, w_scales: Tensor,
    stride: list[int], padding: list[int], dilation: list[int], groups: int,
) -> Tensor:
    """One oneDNN int8 conv, scales folded in; float32 channels_last output."""
    co = wq.shape[0]
    if groups > 1 and wq.shape[1] % 4 != 0 and co // groups > 16:
        # oneDNN returns wrong sums for grouped int8 convs with a channel count per
        # group that is not a multiple of 4 and more than 32 outputs per group; such
        # convs run one group at a time.
        return _qconv_per_group(xu8, x_scale, wq, w_scales, stride, padding, dilation, groups)
    kh, kw = (dilation[i] * (wq.shape[2 + i] - 1) + 1 for i in range(2))
    if padding[0] >= kh or padding[1] >= kw:
        # oneDNN mis-computes windows that lie entirely in the padding (seen with one
        # input channel per group); padding explicitly with the zero point avoids it.
        xu8 = _pad_zero_point(xu8, padding[0], padding[0], padding[1], padding[1])
        padding = [0, 0]
    packed = torch.ops.onednn.qconv_prepack(
        wq, w_scales, x_scale, _ZP, stride, padding, dilation, groups, list(xu8.shape)
    )
    zps = torch.zeros(co, dtype=torch.int64)
    return torch.ops.onednn.qconv_pointwise(
        xu8, x_scale, _ZP, packed, w_scales, zps, None, stride, padding, dilation, groups,
        1.0, 0, torch.float32, "none", [], "",
    )


def _qconv_per_group(
    xu8: Tensor, x_scale: float, wq: Tensor, w_scales: Tensor,
    stride: list[int], padding: list[int], dilation: list[int], groups: int,
) -> Tensor:
    cig, cog = wq.shape[1], wq.shape[0] // groups
    outs = [
        _qconv_raw(
            _group_channel_slice(xu8, groups, 0, cig, grp), x_scale, wq[grp * cog : (grp + 1) * cog],
            w_scales[grp * cog : (grp + 1) * cog].contiguous(), stride, padding, dilation, 1,
        )
        for grp in range(groups)
    ]
    return torch.cat(outs, 1).contiguous(memory_format=torch.channels_last)


def _accumulator_safe(wq: Tensor) -> bool:
    """True if oneDNN's float zero-point compensation is exact for these weights.

    oneDNN computes ``float(sum(u8 * w)) - float(128 * sum(w))``.  With u8 in
    [0, 255] the first term lies in [-255*neg, 255*pos] (pos / neg: sums of the
    positive / negative weights of one output channel), the second is at most
    128*(pos+neg); both must be exact float32 integers (<= 2^24).
    """
    if 255 * 128 * wq[0].numel() <= _F32_EXACT:  # any int8 weights of this size: no data to read
        return True
    w = wq.reshape(wq.shape[0], -1).to(torch.int16)  # |-128| needs more than int8
    a, s = w.abs().sum(1, dtype=torch.int64), w.sum(1, dtype=torch.int64)  # 255 * 256 * taps may pass 2^31
    # pos = (a + s) / 2, neg = (a - s) / 2, so 2 * worst = max(255 (a + |s|), 256 a): fewer small ops per call
    return bool(torch.maximum(255 * (a + s.abs()), 256 * a).max() <= 2 * _F32_EXACT)


def _qconv_exact(
    xu8: Tensor, x_scale: float, wq: Tensor, w_scales: Tensor,
    stride: list[int], padding: list[int], dilation: list[int], groups: int, out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Int8 conv that is exact for any weights: the native kernel (exact int32 sums, weights packed in the
    call), else on CPUs without an int8 dot-product instruction the native AVX2 kernel, else oneDNN (splitting
    Cin when its float compensation could round), else -- where oneDNN's int8 convolution is not exact on this
    CPU (:func:`onednn_int8_conv_exact`) -- im2col + the exact integer GEMM.
    ``out_dtype``: float32, or bfloat16 (the float32 result rounded; written directly by the AMX kernel)."""
    if xu8.shape[0] > 0 and native.conv_forward_supported(int(wq.shape[1]), int(wq.shape[2]), int(wq.shape[3]), groups):
        return native.conv2d_forward_u8s8(xu8, x_scale, wq, w_scales, tuple(stride), tuple(padding), tuple(dilation),
                                          out_dtype=out_dtype)
    if native.avx2_conv_preferred(groups, (int(wq.shape[1]) + int(wq.shape[1]) % 2) * int(wq.shape[2] * wq.shape[3])):
        return native.conv2d_forward_avx2(xu8, x_scale, wq, w_scales, tuple(stride), tuple(padding),
                                          tuple(dilation), out_dtype=out_dtype)
    if not onednn_int8_conv_exact():
        return _qconv_im2col(xu8, x_scale, wq, w_scales, ConvGeometry(tuple(stride), tuple(padding), tuple(dilation),
                                                                      groups), out_dtype)
    return _qconv_exact_onednn(xu8, x_scale, wq, w_scales, stride, padding, dilation, groups).to(out_dtype)


def _qconv_im2col(xu8: Tensor, x_scale: float, wq: Tensor, w_scales: Tensor, geom: ConvGeometry,
                  out_dtype: torch.dtype) -> Tensor:
    """The int8 convolution as im2col of the codes + the machine's exact int8 GEMM (uncounted: the caller counts
    the convolution), with the native kernel's epilogue ``float32(sum) * float32(x_scale * w_scale)`` written
    straight into a fresh channels-last tensor (a view would break in-place ops after the autograd Function;
    a float64 epilogue, one rounding, cost 5.5 ms of a 30 ms 16-channel layer here)."""
    xq = conv_generic.unshift_u8(xu8)
    n = xq.shape[0]
    co, _, k_h, k_w = wq.shape
    g, cog = geom.groups, co // geom.groups
    cols, ho, wo = conv_generic.im2col(xq, k_h, k_w, geom)
    wmat = conv_generic.weight_matrix(wq, g)
    out = torch.empty((n, co, ho, wo), dtype=torch.float32, memory_format=torch.channels_last)
    rows = out.permute(0, 2, 3, 1).view(n * ho * wo, co)
    scale = w_scales.to(torch.float32) * torch.tensor(x_scale, dtype=torch.float32)
    for grp in range(g):
        part = slice(grp * cog, (grp + 1) * cog)
        torch.mul(int8_gemm_kernel(cols[:, grp], wmat[grp]), scale[part], out=rows[:, part])
    return out if out_dtype == torch.float32 else out.to(out_dtype)  # bfloat16: the float32 result rounded


@functools.cache  # the answer is the CPU's and oneDNN's, fixed for the process
def onednn_int8_conv_exact() -> bool:
    """Whether oneDNN's int8 convolution returns exact sums on this CPU, checked by running one.

    With AVX512-VNNI, AVX-VNNI or AMX it multiplies uint8 by int8 into int32 directly.  Without them (e.g. an
    AVX2-only AMD Zen 3) its kernels use ``vpmaddubsw``, which adds two uint8 x int8 products into a
    *saturating* int16: any pair above 32767 is clipped, and random codes came out 15-18% wrong (relative
    error).  The check convolves codes that make every such pair overflow and compares with the exact sums.
    """
    g = torch.Generator().manual_seed(0)
    xu8 = torch.randint(192, 256, (1, 16, 4, 4), dtype=torch.uint8, generator=g)
    wq = torch.randint(96, 128, (8, 16, 3, 3), dtype=torch.int8, generator=g)
    exact = torch.nn.functional.conv2d(xu8.double() - _ZP, wq.double(), padding=1)
    got = _qconv_raw(_channels_last_u8(xu8), 1.0, wq, torch.ones(8), [1, 1], [1, 1], [1, 1], 1)
    return bool(torch.equal(got.double(), exact))


def _qconv_exact_onednn(
    xu8: Tensor, x_scale: float, wq: Tensor, w_scales: Tensor,
    stride: list[int], padding: list[int], dilation: list[int], groups: int,
) -> Tensor:
    if xu8.shape[0] == 0 or _accumulator_safe(wq):
        return _qconv_raw(xu8, x_scale, wq, w_scales, stride, padding, dilation, groups)
    taps = wq.shape[2] * wq.shape[3]
    # 255 * 128 * (channels * taps) <= 2^24 whatever the weights are.
    per_chunk = _F32_EXACT // (255 * 128 * taps)
    if per_chunk < 1:
        raise NotImplementedError(f"kernels with more than 514 taps are not supported ({taps})")
    cig = wq.shape[1]
    ones = torch.ones(wq.shape[0], dtype=torch.float32)
    total = None
    for c0 in range(0, cig, per_chunk):
        c1 = min(cig, c0 + per_chunk)
        xs = _group_channel_slice(xu8, groups, c0, c1)
        part = _qconv_raw(xs, 1.0, wq[:, c0:c1].contiguous(), ones, stride, padding, dilation, groups)
        part = part.to(torch.float64)  # exact integers; float64 sums them exactly
        total = part if total is None else total + part
    scale = (w_scales.to(torch.float64) * x_scale).view(1, -1, 1, 1)
    return (total * scale).to(torch.float32).contiguous(memory_format=torch.channels_last)


def _group_channel_slice(x: Tensor, groups: int, c0: int, c1: int, group: int | None = None) -> Tensor:
    """Channels [c0, c1) of every group of ``x`` (or of one ``group``), channels_last."""
    n, c, h, w = x.shape
    x5 = x.view(n, groups, c // groups, h, w)
    if group is not None:
        x5 = x5[:, group : group + 1]
    part = x5[:, :, c0:c1].reshape(n, x5.shape[1] * (c1 - c0), h, w)
    return part.contiguous(memory_format=torch.channels_last)


# ------------------------------------------------------------------------- forward


def conv2d_forward(xq: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, geom: ConvGeometry) -> Tensor:
    """y = conv2d(xq, wq) * x_scale * w_scale[co]; float32 channels_last, shape as F.conv2d."""
    return conv2d_forward_u8(to_shifted_u8(xq), x_scale, wq, w_scale, geom)


def conv2d_forward_u8(xu8: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, geom: ConvGeometry,
                      out_dtype: torch.dtype = torch.float32) -> Tensor:
    """:func:`conv2d_forward` on shifted codes ``xu8 = xq + 128`` (uint8).

    The activation quantizer can emit these directly (round, clamp, add 128, cast
    to uint8), which saves the shifting pass of :func:`conv2d_forward`.  ``out_dtype=torch.bfloat16`` gives the
    float32 result rounded to bfloat16 (what a layer under bf16 autocast hands on), without a float32 copy on
    the AMX kernel.
    """
    count("conv_fwd")
    if not _on_cpu(xu8, wq):
        return conv_generic.conv2d_forward(xu8, x_scale, wq, w_scale, geom).to(out_dtype)
    co = wq.shape[0]
    return _qconv_exact(
        _channels_last_u8(xu8), _scalar(x_scale), wq.contiguous(), _scale_vector(w_scale, co),
        list(geom.stride), list(geom.padding), list(geom.dilation), geom.groups, out_dtype,
    )


# ------------------------------------------------------------------ input gradient


@dataclass(frozen=True)
class _SubPixelAxis:
    """Sub-pixel plan along one spatial axis of the transposed conv.

    Input position ``i = s*j + r`` (phase r) receives ``g[j + u] * w[k]`` for every
    tap k with ``r + p - k*d == s*u``.  Over all phases the offsets u form a
    progression ``umin + step*t`` (t < taps), so one conv with kernel size ``taps``
    and dilation ``step`` computes every phase at once.
    """

    phases: int  # the stride s
    out_len: int  # J = ceil(size / s): outputs per phase
    umin: int
    step: int
    taps: int
    tap_of: tuple[tuple[tuple[int, int], ...], ...]  # per phase: (kernel k, conv tap t)
    pad_lo: int  # gradient padding before / after (negative = crop)
    pad_hi: int


def _sub_pixel_axis(size: int, g_len: int, k: int, s: int, p: int, d: int) -> _SubPixelAxis:
    pairs = [[(kk, (r + p - kk * d) // s) for kk in range(k) if (r + p - kk * d) % s == 0] for r in range(s)]
    us = sorted({u for phase in pairs for _, u in phase})
    if not us:  # no tap reaches any input position (cannot happen for a valid conv)
        us = [0]
    umin, umax = us[0], us[-1]
    step = 0
    for u in us:
        step = math.gcd(step, u - umin)
    step = max(step, 1)
    taps = (umax - umin) // step + 1
    tap_of = tuple(tuple((kk, (u - umin) // step) for kk, u in phase) for phase in pairs)
    out_len = -(-size // s)
    return _SubPixelAxis(s, out_len, umin, step, taps, tap_of, -umin, out_len - 1 + umax - (g_len - 1))


def _sub_pixel_weight(wq: Tensor, groups: int, ay: _SubPixelAxis, ax: _SubPixelAxis) -> Tensor:
    """Weight [G*sy*sx*Cin_g, Co_g, taps_y, taps_x] of the sub-pixel conv.

    Output channel (group, ry, rx, ci) of the new conv is input channel ci of phase
    (ry, rx); its input channels are the gradient channels of the same group.
    """
    co, cig, kh, kw = wq.shape
    cog = co // groups
    w5 = wq.reshape(groups, cog, cig, kh, kw)
    if all(a.tap_of == (tuple((k, n - 1 - k) for k in range(n)),) for a, n in ((ay, kh), (ax, kw))):
        # one phase whose taps are the kernel's, reversed (every stride-1 conv): the flipped, transposed
        # weight in two ops instead of a scatter per tap (~80 us of Python per call)
        return w5.transpose(1, 2).flip(-2, -1).reshape(groups * cig, cog, kh, kw)
    out = torch.zeros(groups, ay.phases, ax.phases, cig, cog, ay.taps, ax.taps, dtype=torch.int8)
    for ry, ytaps in enumerate(ay.tap_of):
        for rx, xtaps in enumerate(ax.tap_of):
            for kh, th in ytaps:
                for kw, tw in xtaps:
                    out[:, ry, rx, :, :, th, tw] = w5[:, :, :, kh, kw].transpose(1, 2)
    return out.reshape(groups * ay.phases * ax.phases * cig, cog, ay.taps, ax.taps)


def _pad_shifted(gu8: Tensor, ay: _SubPixelAxis, ax: _SubPixelAxis) -> tuple[Tensor, list[int]]:
    """Apply the (possibly asymmetric / negative) gradient padding.

    Symmetric non-negative padding is left to oneDNN; otherwise the uint8 codes are
    copied into a buffer filled with the zero point (which is the real value 0).
    """
    if ay.pad_lo == ay.pad_hi >= 0 and ax.pad_lo == ax.pad_hi >= 0:
        return gu8, [ay.pad_lo, ax.pad_lo]
    return _pad_zero_point(gu8, ay.pad_lo, ay.pad_hi, ax.pad_lo, ax.pad_hi), [0, 0]


def _pad_zero_point(xu8: Tensor, top: int, bottom: int, left: int, right: int) -> Tensor:
    """Pad (negative = crop) shifted codes with the zero point 128, i.e. the real value 0."""
    n, c, h, w = xu8.shape
    hp, wp = h + top + bottom, w + left + right
    buf = torch.empty((n, c, hp, wp), dtype=torch.uint8, memory_format=torch.channels_last).fill_(_ZP)
    src = xu8[:, :, max(0, -top) : h - max(0, -bottom), max(0, -left) : w - max(0, -right)]
    y0, x0 = max(0, top), max(0, left)
    buf[:, :, y0 : y0 + src.shape[2], x0 : x0 + src.shape[3]].copy_(src)
    return buf


def _dgrad_plan(input_hw: tuple, g_hw: tuple, w_hw: tuple, geom: ConvGeometry) -> tuple[_SubPixelAxis, _SubPixelAxis]:
    """The sub-pixel plan of the input gradient, along y and x."""
    (sh, sw), (ph, pw), (dh, dw) = geom.stride, geom.padding, geom.dilation
    return (_sub_pixel_axis(input_hw[0], g_hw[0], w_hw[0], sh, ph, dh),
            _sub_pixel_axis(input_hw[1], g_hw[1], w_hw[1], sw, pw, dw))


def input_grad_phases_shape(input_shape: tuple, g_shape: tuple, w_shape: tuple, geom: ConvGeometry) -> tuple:
    """Shape of :func:`conv2d_input_grad_phases_u8`'s result: [N, groups * sy * sx * Cin_g, Jy, Jx]."""
    ay, ax = _dgrad_plan(tuple(input_shape[2:]), tuple(g_shape[2:]), tuple(w_shape[2:]), geom)
    return (input_shape[0], input_shape[1] * ay.phases * ax.phases, ay.out_len, ax.out_len)


def phases_to_input_grad(y: Tensor, input_shape: tuple, g_shape: tuple, w_shape: tuple,
                         geom: ConvGeometry) -> Tensor:
    """Phase-major sub-pixel conv output -> dx [N, Cin, H, W] (depth-to-space + crop), as views and one reshape.

    Eager, the reshape is one copy whose contiguous runs span a group's channels times the x stride.  Traced,
    it is only index arithmetic: Inductor folds it into whatever reads dx next (BatchNorm and ReLU backward,
    the residual sum), so a strided convolution's input gradient is never copied on its own -- that copy cost
    ~2.3 ms per ResNet-20 stage-1 downsampling layer at batch 128.
    """
    ay, ax = _dgrad_plan(tuple(input_shape[2:]), tuple(g_shape[2:]), tuple(w_shape[2:]), geom)
    return _depth_to_space(y, input_shape, geom.groups, ay, ax)


def _depth_to_space(y: Tensor, input_shape: tuple, groups: int, ay: _SubPixelAxis, ax: _SubPixelAxis) -> Tensor:
    n, cin, h, w = (int(v) for v in input_shape)
    sy, sx = ay.phases, ax.phases
    if sy == 1 and sx == 1 and y.shape[2] == h and y.shape[3] == w:
        return y
    src = y.permute(0, 2, 3, 1).reshape(n, ay.out_len, ax.out_len, groups, sy, sx, cin // groups)
    full = src.permute(0, 1, 4, 2, 5, 3, 6).reshape(n, ay.out_len * sy, ax.out_len * sx, cin)
    return full[:, :h, :w].permute(0, 3, 1, 2)


def conv2d_input_grad(
    gq: Tensor, g_scale: Tensor, wq: Tensor, w_scale: Tensor, input_shape: tuple, geom: ConvGeometry
) -> Tensor:
    """dx = conv_transpose2d(gq, wq) * g_scale * w_scale[ci]; float32 [N,Cin,H,W] channels_last."""
    return conv2d_input_grad_u8(to_shifted_u8(gq), g_scale, wq, w_scale, input_shape, geom)


def conv2d_input_grad_u8(
    gu8: Tensor, g_scale: Tensor, wq: Tensor, w_scale: Tensor, input_shape: tuple, geom: ConvGeometry,
    out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """:func:`conv2d_input_grad` on shifted codes ``gu8 = gq + 128`` (uint8).

    The gradient quantizer can emit these directly and save the shifting pass.
    ``w_scale`` is per input channel (length Cin) or a single element.
    """
    count("conv_dgrad")
    if not _on_cpu(gu8, wq):
        return conv_generic.conv2d_input_grad(gu8, g_scale, wq, w_scale, input_shape, geom).to(out_dtype)
    y, (ay, ax) = _input_grad_phases(gu8, g_scale, wq, w_scale, input_shape, geom, out_dtype)
    return _depth_to_space(y, input_shape, geom.groups, ay, ax).contiguous(memory_format=torch.channels_last)


def conv2d_input_grad_phases_u8(
    gu8: Tensor, g_scale: Tensor, wq: Tensor, w_scale: Tensor, input_shape: tuple, geom: ConvGeometry,
    out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """:func:`conv2d_input_grad_u8` before its depth-to-space (CPU only): the sub-pixel convolution's output,
    float32 channels_last, shape :func:`input_grad_phases_shape`; :func:`phases_to_input_grad` finishes it."""
    count("conv_dgrad")
    return _input_grad_phases(gu8, g_scale, wq, w_scale, input_shape, geom, out_dtype)[0]


def _input_grad_phases(
    gu8: Tensor, g_scale: Tensor, wq: Tensor, w_scale: Tensor, input_shape: tuple, geom: ConvGeometry,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, tuple[_SubPixelAxis, _SubPixelAxis]]:
    """The sub-pixel convolution's output, and the plan it was made with (for the depth-to-space)."""
    n, cin, h, w = (int(v) for v in input_shape)
    ay, ax = plan = _dgrad_plan((h, w), tuple(gu8.shape[2:]), tuple(wq.shape[2:]), geom)
    if n == 0:
        return torch.empty((0, cin * ay.phases * ax.phases, ay.out_len, ax.out_len), dtype=out_dtype,
                           memory_format=torch.channels_last), plan
    w_sub = _sub_pixel_weight(wq, geom.groups, ay, ax)
    # Output channel (group, ry, rx, ci) carries the scale of input channel ci.
    sh, sw = geom.stride
    ws = _scale_vector(w_scale, cin).view(geom.groups, 1, 1, cin // geom.groups)
    ws = ws.expand(geom.groups, sh, sw, cin // geom.groups).reshape(-1).contiguous()
    g_in, padding = _pad_shifted(_channels_last_u8(gu8), ay, ax)
    return _qconv_exact(g_in, _scalar(g_scale), w_sub, ws, [1, 1], padding, [ay.step, ax.step], geom.groups,
                        out_dtype), plan


# ----------------------------------------------------------------- weight gradient


def _batch_chunk(n: int, terms_per_image: int, bytes_per_image: int) -> int:
    """Images per weight-gradient chunk.

    Each int32 partial sums ``images * terms_per_image`` products of magnitude at
    most 128*128 = 2^14, so ``images * terms_per_image * 2^14 <= 2^31 - 1`` rules out
    overflow for any codes (ResNet-20 stage 1, 32x32 outputs: at most 127 images,
    so a full batch of 128 would overflow).  Within that bound a chunk holds about
    2 MiB of activations (one core's L2): bigger chunks mean fewer GEMM calls, whose
    fixed cost dominates for these skinny shapes.
    """
    safe = max(1, _INT32_MAX // (_MAX_PRODUCT * max(1, terms_per_image)))
    cached = max(1, (2 << 20) // max(1, bytes_per_image))
    return max(1, min(n, safe, cached))


def _int_mm(a: Tensor, b: Tensor) -> Tensor:
    """The machine's int8 GEMM kernel (:func:`~inttrain.kernels.matmul.int8_gemm_kernel`), uncounted: the
    weight-gradient convolution that calls it counts itself once."""
    return int8_gemm_kernel(a, b)


def _nhwc(t: Tensor) -> Tensor:
    """[N, C, H, W] -> [N, H, W, C] view (free for channels_last inputs)."""
    return t.permute(0, 2, 3, 1)


class _PaddedBatch:
    """Reused per-call buffers: x zero-padded as NHWC, and g on its grid.

    g is stored either transposed, ``[Co, N, ., .]`` (``transpose_g``), so the GEMM
    reads a row-major ``g^T``, or as NHWC ``[N, ., ., Co]`` and read through a
    transposed view.  The row-major operand makes the GEMMs faster, but transposing
    channels_last int8 costs a slow pass; measured (1 thread): it pays off for
    Co <= 16 or when ``gq`` already is NCHW (then the copy is cheap), not otherwise.
    The buffers are zeroed once per call; each chunk overwrites only the interior,
    so the padding stays zero.
    """

    def __init__(self, chunk: int, cin: int, co: int, x_hw: tuple[int, int], g_hw: tuple[int, int], transpose_g: bool) -> None:
        self.transpose_g = transpose_g
        self.x = torch.zeros((chunk, *x_hw, cin), dtype=torch.int8)
        g_shape = (co, chunk, *g_hw) if transpose_g else (chunk, *g_hw, co)
        self.g = torch.zeros(g_shape, dtype=torch.int8)

    def load(self, x: Tensor, g: Tensor, pad: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """Copy one chunk in; return (x rows [m*Hp*Wp, C], g^T [Co, m*Hg*Wg] (maybe a view))."""
        m, _, h, w = x.shape
        ph, pw = pad
        gh, gw = g.shape[2], g.shape[3]
        dst = self.x[:m, ph : ph + h, pw : pw + w]
        if x.dtype == torch.uint8:  # shifted codes q + 128 (the forward conv's input): a sign-bit flip restores q
            torch.bitwise_xor(_nhwc(x).view(torch.int8), -128, out=dst)
        else:
            dst.copy_(_nhwc(x))
        xf = self.x[:m].view(-1, self.x.shape[3])
        if self.transpose_g:
            self.g[:, :m, :gh, :gw].copy_(g.permute(1, 0, 2, 3))
            return xf, self.g[:, :m].reshape(self.g.shape[0], -1)
        self.g[:m, :gh, :gw].copy_(_nhwc(g))
        return xf, self.g[:m].view(-1, self.g.shape[3]).t()


def _shifted_gemms(xf: Tensor, gt: Tensor, k_h: int, k_w: int, wp: int, geom: ConvGeometry, out: Tensor) -> None:
    """Stride-1 weight gradient of one chunk, added into ``out`` (int64 [G,Cog,kh,kw,Cig]).

    x is on a padded NHWC grid [m, Hp, Wp, C] and g on the same grid (top-left
    aligned, zeros elsewhere).  Flattened to rows, the input pixel of tap (kh, kw) for
    gradient row r is row ``r + dh*kh*Wp + dw*kw``, so each tap is one GEMM
    ``g^T[:, :rows] @ x[offset : offset + rows]`` with no im2col.
    """
    (dh, dw), groups = geom.dilation, geom.groups
    rows = xf.shape[0] - (dh * (k_h - 1) * wp + dw * (k_w - 1))
    cig, cog = xf.shape[1] // groups, gt.shape[0] // groups
    for grp in range(groups):
        a = gt[grp * cog : (grp + 1) * cog, :rows]
        for kh in range(k_h):
            for kw in range(k_w):
                off = dh * kh * wp + dw * kw
                out[grp, :, kh, kw] += _int_mm(a, xf[off : off + rows, grp * cig : (grp + 1) * cig])


def _im2col_gemms(xf: Tensor, gt: Tensor, k_h: int, k_w: int, xp_hw: tuple[int, int], geom: ConvGeometry, out: Tensor) -> None:
    """General-stride weight gradient of one chunk via a per-chunk im2col, added into ``out``."""
    groups, (sh, sw), (dh, dw) = geom.groups, geom.stride, geom.dilation
    hp, wp = xp_hw
    cin, co = xf.shape[1], gt.shape[0]
    m = xf.shape[0] // (hp * wp)
    ho, wo = _out_size(hp, k_h, sh, 0, dh), _out_size(wp, k_w, sw, 0, dw)
    cig, cog = cin // groups, co // groups
    patches = xf.as_strided(
        (m, ho, wo, groups, k_h, k_w, cig),
        (hp * wp * cin, sh * wp * cin, sw * cin, cig, dh * wp * cin, dw * cin, 1),
    )
    cols = patches.contiguous().view(m * ho * wo, groups, k_h * k_w * cig)
    for grp in range(groups):
        prod = _int_mm(gt[grp * cog : (grp + 1) * cog], cols[:, grp])
        out[grp] += prod.view(cog, k_h, k_w, cig)


def conv2d_weight_grad(
    gq: Tensor, g_scale: Tensor, xq: Tensor, x_scale: Tensor, weight_shape: tuple, geom: ConvGeometry
) -> Tensor:
    """dW = sum_{n,h,w} gq * xq_shifted * g_scale[co] * x_scale; float32 ``weight_shape``.

    Takes any memory format; an NCHW-contiguous ``gq`` (which the gradient quantizer
    can emit) is the cheapest to bring into the GEMM layout.  ``xq`` may also be the
    shifted uint8 codes ``q + 128`` that :func:`conv2d_forward_u8` consumed, so the
    forward pass's codes serve here without another pass.

    ``gq`` may be int16 (up to 16-bit gradient codes, e.g. Banner et al.'s gradient bifurcation): it is
    split as in :func:`inttrain.kernels.matmul.split_int16`, ``g = 256 hi + lo + 128`` with int8 halves,
    and ``sum g x = 256 sum hi x + sum lo x + 128 sum x``: one int8 weight-gradient convolution of the halves
    stacked along the output channels, and ``sum x`` (the same for every output channel) from the batch sum of
    ``x``, recombined exactly in int64.
    """
    count("conv_wgrad")
    if not _on_cpu(gq, xq):
        if gq.dtype != torch.int16:
            return conv_generic.conv2d_weight_grad(gq, g_scale, xq, x_scale, weight_shape, geom)
        from . import conv_reference  # exact int64 einsum (other devices: no int16 conv kernel)

        return conv_reference.conv2d_weight_grad(gq, g_scale, conv_generic.unshift_u8(xq), x_scale, weight_shape, geom)
    if gq.dtype == torch.int16:
        dw_int = _int16_weight_grad_int(gq, xq, weight_shape, geom)
    else:
        dw_int = weight_grad_int(gq, xq, weight_shape, geom)
    return _scaled_weight_grad(dw_int, g_scale, x_scale)


def batch_code_sum(q: Tensor) -> Tensor:
    """Exact float64 sums of 4-D codes (int8, int16 or shifted uint8) over the batch, ``[1, C, H, W]``: an int64
    column sum of the images as rows (a reduction over the outer axis of a channels-last tensor is 4x slower)."""
    q = conv_generic.unshift_u8(q)
    last = q.is_contiguous(memory_format=torch.channels_last)
    images = q.permute(0, 2, 3, 1) if last else q
    sums = images.reshape(q.shape[0], -1).sum(0, dtype=torch.int64).to(torch.float64).reshape(1, *images.shape[1:])
    return sums.permute(0, 3, 1, 2) if last else sums


def code_sum_weight_grad(xq: Tensor, g_hw: tuple[int, int], weight_shape: tuple, geom: ConvGeometry) -> Tensor:
    """The weight gradient of an output gradient of all ones, ``sum_{n,h,w} x`` per weight (exact float64, the same
    for every output channel of a group), broadcast to ``weight_shape``."""
    co, cig, k_h, k_w = (int(v) for v in weight_shape)
    every = torch.ones((1, 1, *g_hw), dtype=torch.float64)
    sums = torch.nn.grad.conv2d_weight(batch_code_sum(xq), (1, int(xq.shape[1]), k_h, k_w), every, geom.stride,
                                       geom.padding, geom.dilation)  # [1, Cin, kh, kw]
    per_group = sums.reshape(geom.groups, 1, cig, k_h, k_w).expand(geom.groups, co // geom.groups, cig, k_h, k_w)
    return per_group.reshape(co, cig, k_h, k_w)


def _stacked_halves_impl(q: Tensor) -> Tensor:
    """:func:`~.matmul.split_int16`'s ``(hi, lo)`` of ``[N, C, ...]`` codes, stacked as ``[N, 2C, ...]``."""
    q32 = q.to(torch.int32)
    hi = torch.bitwise_right_shift(q32, 8)
    return torch.cat([hi.to(torch.int8), (q32 - hi * 256 - 128).to(torch.int8)], 1)


def _int16_weight_grad_int(gq: Tensor, xq: Tensor, weight_shape: tuple, geom: ConvGeometry) -> Tensor:
    """Exact int64 weight-gradient sums of int16 ``gq``: ``g = 256 hi + lo + 128`` (split_int16)."""
    co = int(weight_shape[0])
    if geom.groups == 1:  # the halves stacked: one call reads x once (as conv_wide does)
        stacked = run_fused(_stacked_halves_impl, {"q": gq}, {})  # one pass; eager: ~8 int32 passes
        sums = weight_grad_int(stacked, xq, (2 * co, *weight_shape[1:]), geom)
        hi_sums, lo_sums = sums[:co], sums[co:]
    else:
        from .matmul import split_int16

        hi_sums, lo_sums = (weight_grad_int(part, xq, weight_shape, geom) for part in split_int16(gq))
    ones = code_sum_weight_grad(xq, tuple(gq.shape[2:]), weight_shape, geom).to(torch.int64)
    return 256 * hi_sums + lo_sums + 128 * ones


def _scaled_weight_grad(dw_int: Tensor, g_scale: Tensor, x_scale: Tensor) -> Tensor:
    """Exact int64 sums ``[Co, ...]`` times ``g_scale[co] * x_scale``, in float64, as float32."""
    co = dw_int.shape[0]
    scale = _scale_vector(g_scale, co).to(torch.float64) * _scalar(x_scale)
    return (dw_int.to(torch.float64) * scale.view(co, *[1] * (dw_int.dim() - 1))).to(torch.float32)


def conv2d_weight_grad_float(
    dy: Tensor, g_scale: Tensor, qmax: int, stochastic: bool, seed: int, xq: Tensor, x_scale: Tensor,
    weight_shape: tuple, geom: ConvGeometry,
) -> Tensor:
    """:func:`conv2d_weight_grad` of the codes of the float gradient ``dy`` at scale ``g_scale`` (one per
    output channel, or one): ``clamp(round(dy / g_scale), -qmax, qmax)``, rounded to nearest even or
    stochastically with ``seed``, exactly the codes of :func:`inttrain.kernels.fused.quantize_matrix` on dy's
    channels-last ``[N*Ho*Wo, Co]`` view with that scale.

    On CPUs with a native kernel (VNNI, or AVX2 without an int8 dot product) the codes are made while the kernel
    packs the gradient (no pass that writes them, and the stochastic-rounding hash in AVX512 / AVX2 integer
    lanes); elsewhere they are made here and handed to :func:`conv2d_weight_grad`.  All give the same result bit
    for bit.
    """
    on_cpu = _on_cpu(dy, xq) and qmax <= 127
    kernel = _float_weight_grad_kernel(geom.groups, int(dy.shape[2]), int(dy.shape[3])) if on_cpu else None
    if kernel is not None:
        count("conv_wgrad")
        dy_in = dy if dy.dtype == torch.bfloat16 else dy.to(torch.float32)  # the kernel reads bfloat16 itself
        dw_int = kernel(dy_in, g_scale, qmax, stochastic, seed, xq, weight_shape, geom.stride, geom.padding,
                        geom.dilation)
        return _scaled_weight_grad(dw_int, g_scale, x_scale)
    fmt = IntFormat(qmax.bit_length() + 1)  # the symmetric signed format whose largest code is qmax
    rows = dy.to(torch.float32).permute(0, 2, 3, 1).reshape(-1, dy.shape[1])
    codes = round_and_clamp(rows / g_scale.reshape(1, -1).to(torch.float32), fmt,
                            Rounding.STOCHASTIC if stochastic else Rounding.NEAREST_EVEN, seed)
    gq = codes.to(storage_dtype(fmt)).reshape(dy.shape[0], dy.shape[2], dy.shape[3], -1).permute(0, 3, 1, 2)
    return conv2d_weight_grad(gq, g_scale, xq, x_scale, weight_shape, geom)


def _float_weight_grad_kernel(groups: int, ho: int, wo: int) -> Callable | None:
    """The native kernel that quantizes a float gradient while it packs it, where one runs: VNNI, else AVX2."""
    if groups == 1 and native.available():
        return native.conv2d_weight_grad_float
    avx2 = native.avx2_conv_preferred(groups) and native.avx2_weight_grad_fits(ho, wo)
    return native.conv2d_weight_grad_float_avx2 if avx2 else None


def weight_grad_int(gq: Tensor, xq: Tensor, weight_shape: tuple, geom: ConvGeometry) -> Tensor:
    """The exact int64 sums ``sum_{n,h,w} gq * xq`` of the CPU weight-gradient convolution, ``[Co, Cig, kh, kw]``."""
    if geom.groups == 1 and native.available():  # register-tiled VNNI kernel, no im2col (3-4x faster)
        return native.conv2d_weight_grad_int(gq, xq, weight_shape, geom.stride, geom.padding, geom.dilation)
    if native.avx2_conv_preferred(geom.groups) and native.avx2_weight_grad_fits(int(gq.shape[2]), int(gq.shape[3])):
        # the same without VNNI: int16 pixel pairs, no im2col
        return native.conv2d_weight_grad_avx2(gq, xq, weight_shape, geom.stride, geom.padding, geom.dilation)
    co, cig, k_h, k_w = (int(v) for v in weight_shape)
    n, cin, h, w = xq.shape
    ho, wo = gq.shape[2], gq.shape[3]
    groups, (ph, pw) = geom.groups, geom.padding
    hp, wp = h + 2 * ph, w + 2 * pw
    acc = torch.zeros((groups, co // groups, k_h, k_w, cig), dtype=torch.int64)
    step = _batch_chunk(n, ho * wo, hp * wp * cin)
    # Stride 1 with few channels: shifted GEMMs (no im2col copy).  With more channels one im2col
    # copy per chunk + one GEMM beats nine skinny GEMMs (measured, batch 128: 32ch@16px 3.2 vs
    # 4.3 ms, 64ch@8px 1.9 vs 2.8 ms; 16ch@32px 9.9 vs 7.9 ms the other way round).
    shifted = tuple(geom.stride) == (1, 1) and cin // groups <= 16
    # Shifted GEMMs: g sits on x's padded grid; im2col: g keeps its own [Ho, Wo] grid.
    transpose_g = co <= 16 or gq.is_contiguous()
    g_hw = (hp, wp) if shifted else (ho, wo)
    bufs = _PaddedBatch(step, cin, co, (hp, wp), g_hw, transpose_g) if n else None
    for n0 in range(0, n, step):
        xf, gt = bufs.load(xq[n0 : n0 + step], gq[n0 : n0 + step], (ph, pw))
        if shifted:
            _shifted_gemms(xf, gt, k_h, k_w, wp, geom, acc)
        else:
            _im2col_gemms(xf, gt, k_h, k_w, (hp, wp), geom, acc)
    # [G, Cog, kh, kw, Cig] -> [Co, Cig, kh, kw]
    return acc.permute(0, 1, 4, 2, 3).reshape(co, cig, k_h, k_w)
