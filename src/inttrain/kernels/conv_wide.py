"""Exact convolutions of wide codes (9..16-bit, int16 storage) on the CPU's int8 convolution kernels.

An int16 code ``q <= 32639`` splits into two int8 halves, rounding rather than flooring:

    hi = floor((q + 128) / 256),   lo = q - 256 hi   (lo in [-128, 127]),   q = 256 hi + lo,

and ``q = 0`` gives ``hi = lo = 0``, so a convolution's zero padding is zero padding in both halves.  A
convolution is linear in each operand, so one with wide codes is the weighted sum of the int8 convolutions of
the halves -- two when one operand is wide, four when both are (DoReFa at k = 8: 9-bit activations, weights
and gradients) -- each on :mod:`.conv`'s kernels (native VNNI/AMX, else oneDNN).  Why not
:mod:`.conv_generic`: its im2col copies (k_h x k_w times the activation) and int64 passes made a 9-bit
ResNet-20 layer ~20x slower than the int8 one (32 channels at 16x16, batch 128: 258 vs 13 ms per
forward + backward on one core).

The forward and input-gradient kernels return float32 ``sum * scale``: with unit scales that is the integer
sum, exact while it stays within 2^24.  Each product of two halves is at most 128 x 128 = 2^14, so the
reduction is cut into chunks of at most 1024 terms (input channels x kernel taps; output channels for the
input gradient), and one native pass (``native.wide_combine``) reads every part, adds them in float64 (exact)
and writes the scaled float32 result; float64 torch ops do the same where the native library does not load.
The weight-gradient kernel hands back exact int64 sums.  The final scaling is :mod:`.conv_generic`'s (float64
sum times float64 scales, rounded once to float32), so the results equal it -- and :mod:`.conv_reference` --
bit for bit.

Falls back to :mod:`.conv_generic` (any device, any code) off the CPU, inside ``torch.compile`` (the kernels
run through ``ctypes``, which a graph cannot trace), for grouped convolutions whose reduction needs chunking,
and for the few 16-bit codes above 32639.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import conv, conv_generic, native
from .conv_geometry import ConvGeometry
from .counters import count

__all__ = ["split_rounded", "conv2d_forward", "conv2d_input_grad", "conv2d_weight_grad"]

_HALF_MAX = 32639  # largest code whose rounded high half fits int8: floor((32639 + 128) / 256) = 127
_CHUNK_TERMS = (1 << 24) // (128 * 128)  # products of halves summed exactly in float32

_Parts = list[tuple[int, Tensor]]  # (weight 256^k, int8 codes): codes = sum of weight * part


def split_rounded(q: Tensor) -> tuple[Tensor, Tensor]:
    """int16 codes up to 32639 -> int8 ``(hi, lo)`` with ``q = 256 hi + lo`` exactly, ``lo`` in [-128, 127]."""
    q = q.to(torch.int16)
    hi = torch.bitwise_right_shift(q + 128, 8)  # arithmetic shift: the floor; q + 128 fits int16 below 32640
    return hi.to(torch.int8), (q - hi * 256).to(torch.int8)  # exact in int16: the difference is in [-128, 127]


def _parts(q: Tensor) -> _Parts:
    """``q`` (int8, shifted uint8 or int16) as weighted int8 parts."""
    q = conv_generic.unshift_u8(q)
    if q.dtype == torch.int8:
        return [(1, q)]
    hi, lo = split_rounded(q)
    return [(256, hi), (1, lo)]


def _fits(*codes: Tensor) -> bool:
    """Whether every int16 operand splits into int8 halves (one reduction each; int8 codes always do)."""
    return all(q.dtype != torch.int16 or (q.numel() == 0 or bool(q.max() <= _HALF_MAX))
               for q in codes)


def _usable(*codes: Tensor) -> bool:
    return (not torch.compiler.is_compiling() and all(q.device.type == "cpu" for q in codes) and _fits(*codes))


def _chunks(channels: int, taps: int, groups: int) -> list[slice] | None:
    """Channel ranges of at most :data:`_CHUNK_TERMS` terms (``channels``: per group), a multiple of 4 wide
    (the native kernels' lanes) when there are several; None where that cannot be (grouped convolutions,
    kernels of more than 256 taps)."""
    if channels * taps <= _CHUNK_TERMS:
        return [slice(None)]
    per = _CHUNK_TERMS // taps // 4 * 4
    if groups != 1 or per == 0:
        return None
    return [slice(c0, min(channels, c0 + per)) for c0 in range(0, channels, per)]


def _weighted_sum(terms) -> Tensor:
    """Exact float64 sum of ``weight * float32 integer sums`` (in place: one pass per term)."""
    acc = None
    for weight, part in terms:
        if acc is None:
            acc = part.to(torch.float64)
            if weight != 1:
                acc.mul_(weight)
        else:
            acc.add_(part, alpha=weight)
    return acc


def _combined(terms: list[tuple[int, Tensor]], channels: int, scale_a: Tensor, scale_b: Tensor) -> Tensor:
    """``(sum of weight * part) * scale_a * scale_b[c]`` as float32 channels-last ``[N, channels, H, W]``: one
    native pass where the library loads, else float64 torch ops (the same result bit for bit)."""
    if native.available():
        parts = [(weight, part.contiguous(memory_format=torch.channels_last)) for weight, part in terms]
        return native.wide_combine(parts, channels, conv._scale_vector(scale_b, channels),
                                   float(scale_a.reshape(-1)[0]))
    return _scaled(_weighted_sum(terms), scale_a, scale_b, channels, 1).contiguous(memory_format=torch.channels_last)


def _scaled(acc: Tensor, scale_a: Tensor, scale_b: Tensor, n: int, dim: int) -> Tensor:
    """``acc * scale_a * scale_b[c]`` along ``dim`` in float64, one rounding to float32 (conv_generic's)."""
    scale = conv._scale_vector(scale_b, n).to(torch.float64) * float(scale_a.reshape(-1)[0])
    shape = [1] * acc.dim()
    shape[dim] = n
    return acc.mul_(scale.view(shape)).to(torch.float32)


def _stacked(parts: _Parts, dim: int, groups: int) -> list[tuple[list[int], Tensor]]:
    """The parts stacked along ``dim`` (channels the convolution keeps): one weight-gradient convolution then
    gives every part's sums as row blocks of its output, reading the other operand once (ResNet-20's 9-bit
    weight gradients 6-22% faster in one interleaved A/B).  Not for the forward and input-gradient kernels,
    whose channel count picks their tiling (stacked: 16-channel layers 1.3-2.3x slower).  Grouped
    convolutions keep one call per part."""
    if groups != 1 or len(parts) == 1:
        return [([weight], part) for weight, part in parts]
    return [([weight for weight, _ in parts], torch.cat([part for _, part in parts], dim))]


def conv2d_forward(xq: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, geom: ConvGeometry) -> Tensor:
    """``conv2d(xq, wq) * x_scale * w_scale[co]`` as float32 channels-last; codes int8, shifted uint8 or int16."""
    co, cg, k_h, k_w = (int(v) for v in wq.shape)
    chunks = _chunks(cg, k_h * k_w, geom.groups)
    if chunks is None or not _usable(xq, wq):
        return conv_generic.conv2d_forward(xq, x_scale, wq, w_scale, geom)
    one, ones = torch.ones(1), torch.ones(co)
    terms = [(wx * ww, conv.conv2d_forward(x[:, c], one, w[:, c], ones, geom))
             for c in chunks for wx, x in _parts(xq) for ww, w in _parts(wq)]
    return _combined(terms, co, x_scale, w_scale)


def conv2d_input_grad(gq: Tensor, g_scale: Tensor, wq: Tensor, w_scale: Tensor, input_shape: tuple,
                      geom: ConvGeometry) -> Tensor:
    """``conv_transpose2d(gq, wq) * g_scale * w_scale[ci]`` as float32 ``input_shape``, channels-last."""
    co, cig, k_h, k_w = (int(v) for v in wq.shape)
    chunks = _chunks(co // geom.groups, k_h * k_w, geom.groups)
    if chunks is None or not _usable(gq, wq):
        return conv_generic.conv2d_input_grad(gq, g_scale, wq, w_scale, input_shape, geom)
    cin = int(input_shape[1])
    one, ones = torch.ones(1), torch.ones(cin)
    terms = [(wg * ww, conv.conv2d_input_grad(g[:, c], one, w[c], ones, input_shape, geom))
             for c in chunks for wg, g in _parts(gq) for ww, w in _parts(wq)]
    return _combined(terms, cin, g_scale, w_scale)


def conv2d_weight_grad(gq: Tensor, g_scale: Tensor, xq: Tensor, x_scale: Tensor, weight_shape: tuple,
                       geom: ConvGeometry) -> Tensor:
    """``sum_{n,h,w} gq * im2col(xq) * g_scale[co] * x_scale`` as float32 ``weight_shape`` (exact int64 sums)."""
    if not _usable(gq, xq):
        return conv_generic.conv2d_weight_grad(gq, g_scale, xq, x_scale, weight_shape, geom)
    co = int(weight_shape[0])
    acc = None
    for weights, g in _stacked(_parts(gq), 1, geom.groups):
        for wx, x in _parts(xq):
            count("conv_wgrad")
            sums = conv.weight_grad_int(g, x, (g.shape[1], *weight_shape[1:]), geom)
            for j, wg in enumerate(weights):
                part = wg * wx * sums[j * co : (j + 1) * co]
                acc = part if acc is None else acc + part
    return _scaled(acc.to(torch.float64), x_scale, g_scale, co, 0)
