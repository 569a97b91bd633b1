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

Codes that are an int8 code times a constant plus an offset need only one int8 convolution (a ~4x saving in the
9 x 9-bit case): DoReFa's (``recipes.dorefa``) activations are unsigned bytes ``q = j + 128`` and its weights and
gradients odd numbers ``q = 2 j + 1``, ``j`` int8.  For ``x = a_x j_x + b_x`` (on real positions: zero padding
stays zero) and ``w = a_w j_w + b_w``, linearity gives

    conv(x, w) = a_x a_w conv(j_x, j_w) + a_w b_x conv(1, j_w) + b_w conv(x, 1),

one int8 convolution plus two exact float64 corrections that each reduce over one operand only (the first is the
same for every image, the second for every output channel; both as small as one channel of the output).  The
input- and weight-gradient convolutions decompose the same way.  :func:`affine_codes` recognises such codes (two
reductions over the operand); other wide codes take the int8 halves.

A compiled graph calls these functions as the ``inttrain::conv_wide_*`` operators (:mod:`.ops`: the kernels run
through ``ctypes``, which a graph cannot trace).  Falls back to :mod:`.conv_generic` (any device, any code) off the
CPU, for grouped convolutions whose reduction needs chunking, and for the few 16-bit codes above 32639.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from . import conv, conv_generic, native
from .conv_geometry import ConvGeometry
from .counters import count
from .fused import run_fused

__all__ = ["split_rounded", "AffineCodes", "affine_codes", "conv2d_forward", "conv2d_input_grad",
           "conv2d_weight_grad"]

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


@dataclass(frozen=True)
class AffineCodes:
    """Codes ``q = mul * j + add`` at every real position, ``j`` int8 (zero padding stays zero in ``q``)."""

    q: Tensor  # int8 or int16 codes
    mul: int
    add: int

    def j(self) -> Tensor:
        """The int8 ``j`` (the weight operands of the kernels)."""
        return self._convert(shifted=False)

    def shifted(self) -> Tensor:
        """``j + 128`` as uint8: the shifted codes the kernels read as their activation / gradient operand."""
        return self._convert(shifted=True)

    def _convert(self, shifted: bool) -> Tensor:
        if self.q.dtype == torch.int8:
            return conv.to_shifted_u8(self.q) if shifted else self.q
        flat, restore = _flat(self.q)
        return restore(run_fused(_affine_j_impl, {"q": flat}, {"mul": self.mul, "add": self.add, "shifted": shifted}))


def _flat(q: Tensor):
    """``q`` as a 1-D view in memory order and the function that views a result of that length back in ``q``'s
    shape and layout.  The fused passes see 1-D tensors only: with 4-D ones every layer's strides were new
    guards, and a compiled training step hit Dynamo's recompile limit of 8."""
    if q.dim() == 4 and not q.is_contiguous() and q.is_contiguous(memory_format=torch.channels_last):
        n, c, h, w = q.shape
        return q.permute(0, 2, 3, 1).reshape(-1), lambda t: t.view(n, h, w, c).permute(0, 3, 1, 2)
    q = q.contiguous()
    return q.view(-1), lambda t: t.view(q.shape)


def _affine_j_impl(q: Tensor, mul: int, add: int, shifted: bool) -> Tensor:
    j = q.to(torch.int32) - add
    if mul == 2:
        j = torch.bitwise_right_shift(j, 1)  # exact: q - add is even
    return (j + 128).to(torch.uint8) if shifted else j.to(torch.int8)


def _code_stats_impl(q: Tensor) -> Tensor:
    q = q.to(torch.int32)
    return torch.stack([q.amin(), q.amax(), torch.bitwise_and(q, 1).amin()])


def affine_codes(q: Tensor) -> AffineCodes | None:
    """``q`` as :class:`AffineCodes`: int8 codes as they are, unsigned 8-bit codes (0..255) as ``j + 128``, odd
    codes within +-255 as ``2 j + 1``; None for other codes (and empty ones).  One fused pass reads ``q``."""
    q = conv_generic.unshift_u8(q)
    if q.dtype == torch.int8:
        return AffineCodes(q, 1, 0)
    if q.dtype != torch.int16 or q.numel() == 0:
        return None
    low, high, lowest_bit = run_fused(_code_stats_impl, {"q": _flat(q)[0]}, {}).tolist()
    if low >= 0 and high <= 255:
        return AffineCodes(q, 1, 128)
    if low >= -255 and high <= 255 and lowest_bit == 1:  # every code odd
        return AffineCodes(q, 2, 1)
    return None


def _affine_pair(a: Tensor, b: Tensor, geom: ConvGeometry) -> tuple[AffineCodes, AffineCodes] | None:
    """Both operands as affine codes, when the single-convolution path can take them (CPU, ungrouped, eager)."""
    if geom.groups != 1 or torch.compiler.is_compiling() or a.device.type != "cpu" or b.device.type != "cpu":
        return None
    pa = affine_codes(a)
    pb = affine_codes(b) if pa is not None else None
    return None if pb is None else (pa, pb)


def _code_sum_impl(q: Tensor, dim: int) -> Tensor:
    return q.to(torch.int32).sum(dim, keepdim=True).to(torch.float64)


def _channel_sum(q: Tensor, dim: int) -> Tensor:
    """Exact float64 sums of the codes over ``dim`` (0 or 1), kept as a dimension of one: over the channels (int32:
    up to 65536 codes of 16 bits) one fused pass, over the batch :func:`.conv.batch_code_sum`."""
    if dim == 0:
        return conv.batch_code_sum(q)
    return run_fused(_code_sum_impl, {"q": conv_generic.unshift_u8(q)}, {"dim": 1})


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


def _affine_combine_impl(part: Tensor, tile: Tensor, row: Tensor, scale: Tensor, mul: int) -> Tensor:
    return ((part.to(torch.float64) * mul + tile + row) * scale).to(torch.float32)


def _affine_combined(terms: list[tuple[int, Tensor]], channels: int, scale_a: Tensor, scale_b: Tensor,
                     corrections: tuple[Tensor, ...]) -> Tensor:
    """:func:`_combined` with the affine codes' corrections: one fused pass (``torch.compile``, see
    :mod:`.fused`) for a single part, the usual case; float64 torch ops to sum the chunks of long reductions."""
    zero = torch.zeros((1, 1, 1, 1), dtype=torch.float64)
    tile, row = (corrections + (zero, zero))[:2]
    scale = (conv._scale_vector(scale_b, channels).to(torch.float64) * float(scale_a.reshape(-1)[0])).view(1, -1, 1, 1)
    mul, part = terms[0]
    if len(terms) > 1:
        mul, part = 1, _weighted_sum(terms)
    y = run_fused(_affine_combine_impl, {"part": part, "tile": tile, "row": row, "scale": scale}, {"mul": mul})
    return y.contiguous(memory_format=torch.channels_last)


def _combined(terms: list[tuple[int, Tensor]], channels: int, scale_a: Tensor, scale_b: Tensor,
              corrections: tuple[Tensor, ...] = ()) -> Tensor:
    """``(sum of weight * part + corrections) * scale_a * scale_b[c]`` as float32 channels-last
    ``[N, channels, H, W]``: one native pass where the library loads, else float64 torch ops (the same result bit
    for bit).  ``corrections``: float64 integer tensors that broadcast to the output (the affine codes' terms)."""
    if corrections:
        return _affine_combined(terms, channels, scale_a, scale_b, corrections)
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
    affine = _affine_pair(xq, wq, geom) if chunks is not None else None
    if affine is not None:
        return _affine_forward(xq, x_scale, wq, w_scale, geom, *affine, chunks)
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
    affine = _affine_pair(gq, wq, geom) if chunks is not None else None
    if affine is not None:
        return _affine_input_grad(gq, g_scale, wq, w_scale, input_shape, geom, *affine, chunks)
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
    affine = _affine_pair(gq, xq, geom)
    if affine is not None:
        return _affine_weight_grad(gq, g_scale, xq, x_scale, weight_shape, geom, *affine)
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


# ---------------------------------------------------------------- affine codes: one int8 convolution each

def _affine_forward(xq: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, geom: ConvGeometry, xa: AffineCodes,
                    wa: AffineCodes, chunks: list[slice]) -> Tensor:
    """``conv(x, w) = a_x a_w conv(j_x, j_w) + a_w b_x conv(1, j_w) + b_w conv(x, 1)`` (module docstring)."""
    co, _, k_h, k_w = (int(v) for v in wq.shape)
    one, ones = torch.ones(1), torch.ones(co)
    xu8, wj = xa.shifted(), wa.j()
    terms = [(xa.mul * wa.mul, conv.conv2d_forward_u8(xu8[:, c], one, wj[:, c], ones, geom)) for c in chunks]
    args = (None, geom.stride, geom.padding, geom.dilation)
    corrections = []
    if xa.add:  # x's offset on the real (unpadded) positions: one image's worth, the same for every image
        valid = torch.ones((1, 1, *xq.shape[2:]), dtype=torch.float64)
        corrections.append(F.conv2d(valid, _channel_sum(wj, 1), *args).mul_(xa.add * wa.mul))
    if wa.add:  # w's offset times every code of x in the window: the same for every output channel
        box = torch.ones((1, 1, k_h, k_w), dtype=torch.float64)
        corrections.append(F.conv2d(_channel_sum(xq, 1), box, *args).mul_(wa.add))
    return _combined(terms, co, x_scale, w_scale, tuple(corrections))


def _affine_input_grad(gq: Tensor, g_scale: Tensor, wq: Tensor, w_scale: Tensor, input_shape: tuple,
                       geom: ConvGeometry, ga: AffineCodes, wa: AffineCodes, chunks: list[slice]) -> Tensor:
    """``convT(g, w) = a_g a_w convT(j_g, j_w) + a_w b_g convT(1, j_w) + b_w convT(g, 1)``."""
    _, _, k_h, k_w = (int(v) for v in wq.shape)
    cin = int(input_shape[1])
    one, ones = torch.ones(1), torch.ones(cin)
    gu8, wj = ga.shifted(), wa.j()
    terms = [(ga.mul * wa.mul, conv.conv2d_input_grad_u8(gu8[:, c], one, wj[c], ones, input_shape, geom))
             for c in chunks]
    args = (geom.stride, geom.padding, geom.dilation)
    corrections = []
    if ga.add:  # g's offset at every output position: the same for every image
        every = torch.ones((1, 1, *gq.shape[2:]), dtype=torch.float64)
        corrections.append(torch.nn.grad.conv2d_input((1, cin, *input_shape[2:]), _channel_sum(wj, 0), every,
                                                      *args).mul_(ga.add * wa.mul))
    if wa.add:  # w's offset times every code of g reaching a pixel: the same for every input channel
        box = torch.ones((1, 1, k_h, k_w), dtype=torch.float64)
        corrections.append(torch.nn.grad.conv2d_input((int(input_shape[0]), 1, *input_shape[2:]), box,
                                                      _channel_sum(gq, 1), *args).mul_(wa.add))
    return _combined(terms, cin, g_scale, w_scale, tuple(corrections))


def _affine_weight_grad(gq: Tensor, g_scale: Tensor, xq: Tensor, x_scale: Tensor, weight_shape: tuple,
                        geom: ConvGeometry, ga: AffineCodes, xa: AffineCodes) -> Tensor:
    """``sum g x = a_g a_x sum j_g j_x + a_g b_x sum j_g 1 + b_g sum 1 x`` (1: the real positions), exact int64."""
    count("conv_wgrad")
    co = int(weight_shape[0])
    gj = ga.j()
    acc = conv.weight_grad_int(gj, xa.shifted(), weight_shape, geom) * (ga.mul * xa.mul)
    args = (geom.stride, geom.padding, geom.dilation)
    if xa.add:  # x's offset on the real positions against the summed j_g: the same for every input channel
        valid = torch.ones((1, 1, *xq.shape[2:]), dtype=torch.float64)
        part = torch.nn.grad.conv2d_weight(valid, (co, 1, *weight_shape[2:]), _channel_sum(gj, 0), *args)
        acc += part.mul_(ga.mul * xa.add).to(torch.int64)
    if ga.add:  # g's offset at every output position against the summed codes of x: the same for every co
        acc += conv.code_sum_weight_grad(xq, tuple(gq.shape[2:]), weight_shape, geom).mul(ga.add).to(torch.int64)
    return _scaled(acc.to(torch.float64), x_scale, g_scale, co, 0)
