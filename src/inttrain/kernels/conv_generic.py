"""Device-generic exact int8 convolutions: im2col + the integer GEMM (``torch._int_mm``).

oneDNN's int8 convolution (:mod:`.conv`) exists only on CPU; on other devices (CUDA, where
``torch._int_mm`` runs on int8 tensor cores) these functions compute the same three convolutions
from an im2col matrix and :func:`~inttrain.kernels.matmul.int8_mm`, whose zero padding meets
cuBLASLt's shape rules and whose K-splitting keeps int32 exact.  They are slower than a native
convolution (the im2col copy is k_h x k_w times the activation) but exact, and they are tested
bit for bit against :mod:`.conv_reference` on CPU.

Signatures and results are those of :mod:`.conv`: float32 ``acc * scale_a * scale_b``.  Codes may also be
int16 (9..16-bit formats): :func:`~inttrain.kernels.matmul.int_mm` splits them into exact int8 halves, as
for Linear layers, so wide convolutions stay exact on int8 kernels.  The activation's codes are split before
im2col (k_h x k_w times fewer codes to split) and the other operand's halves share one GEMM with a ones
row/column that supplies the sums the split's ``+ 128`` needs: a 9-bit ResNet-20 step (DoReFa at k = 8) went
from 33 s to 7.4 s on one core.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .conv_geometry import ConvGeometry
from .matmul import int_mm, split_int16

__all__ = ["conv2d_forward", "conv2d_input_grad", "conv2d_weight_grad", "im2col", "unshift_u8", "weight_matrix"]


def unshift_u8(codes: Tensor) -> Tensor:
    """Shifted uint8 codes ``q + 128`` back to int8 ``q`` (a sign-bit flip); signed codes pass through."""
    return codes if codes.dtype != torch.uint8 else torch.bitwise_xor(codes.view(torch.int8), -128)


def _out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def im2col(x: Tensor, k_h: int, k_w: int, geom: ConvGeometry, pad_value: int = 0) -> tuple[Tensor, int, int]:
    """int8 NCHW -> columns ``[N*Ho*Wo, G, k_h*k_w*Cg]`` (row = output pixel, col = (kh, kw, c) of one group)."""
    n, c, h, w = x.shape
    (sh, sw), (ph, pw), (dh, dw), g = geom.stride, geom.padding, geom.dilation, geom.groups
    xp = F.pad(x.permute(0, 2, 3, 1), (0, 0, pw, pw, ph, ph), value=pad_value).contiguous()  # padded NHWC
    hp, wp = h + 2 * ph, w + 2 * pw
    ho, wo = _out_size(h, k_h, sh, ph, dh), _out_size(w, k_w, sw, pw, dw)
    cg = c // g
    patches = xp.as_strided(
        (n, ho, wo, g, k_h, k_w, cg), (hp * wp * c, sh * wp * c, sw * c, cg, dh * wp * c, dw * c, 1)
    )
    return patches.reshape(n * ho * wo, g, k_h * k_w * cg), ho, wo


def weight_matrix(wq: Tensor, groups: int) -> Tensor:
    """Weights ``[Co, Cg, k_h, k_w]`` as ``[G, k_h*k_w*Cg, Co/G]``: rows in :func:`im2col`'s column order (kh, kw, c)."""
    co, cg, k_h, k_w = wq.shape
    return wq.reshape(groups, co // groups, cg, k_h, k_w).permute(0, 3, 4, 2, 1).reshape(groups, k_h * k_w * cg,
                                                                                       co // groups)


def _columns(xq: Tensor, k_h: int, k_w: int, geom: ConvGeometry) -> tuple[tuple[Tensor, ...], int, int]:
    """The im2col matrix of the codes ``xq``: ``(cols,)`` for int8 codes; for int16 codes the im2col matrices of
    their int8 halves ``(hi, lo)``, ``x = 256 hi + lo + 128`` at every position, the padding (x = 0: hi 0,
    lo -128) included.  Splitting before im2col touches k_h*k_w times fewer codes than splitting the columns
    (measured: a 9-bit 16-channel 3x3 layer at batch 128 spent ~1.2 s a GEMM in int32/int64 passes over them)."""
    if xq.dtype != torch.int16:
        cols, ho, wo = im2col(xq, k_h, k_w, geom)
        return (cols,), ho, wo
    hi, lo = split_int16(xq)
    cols_hi, ho, wo = im2col(hi, k_h, k_w, geom)
    cols_lo, _, _ = im2col(lo, k_h, k_w, geom, pad_value=-128)
    return (cols_hi, cols_lo), ho, wo


def _with_ones(codes: Tensor, dim: int) -> Tensor:
    """int16 codes ``t = 256 hi + lo + 128`` as one int8 matrix ``[hi | lo | 1]`` stacked along ``dim`` (1: columns
    of a GEMM's rhs, 0: rows of its lhs).  One int8 GEMM with it gives the other operand's products with both
    halves and, from the ones, that operand's sums, which the ``+ 128`` needs (see :func:`_recombine`)."""
    hi, lo = split_int16(codes)
    ones_shape = list(codes.shape)
    ones_shape[dim] = 1
    return torch.cat([hi, lo, hi.new_ones(ones_shape)], dim=dim)


def _recombine(p: Tensor, n: int, dim: int) -> Tensor:
    """The exact (int64) product with the int16 codes, from the product ``p`` with their :func:`_with_ones` matrix
    (``n``: the codes' extent along ``dim``): ``256 P_hi + P_lo + 128 P_ones``."""
    p = p.to(torch.int64)
    return 256 * p.narrow(dim, 0, n) + p.narrow(dim, n, n) + 128 * p.narrow(dim, 2 * n, 1)


def _columns_product(cols: tuple[Tensor, ...], grp: int, other: Tensor, other_first: bool) -> Tensor:
    """Exactly (int64): ``other @ cols[:, grp]`` (``other_first``: ``other`` [rows, N*Ho*Wo]) or
    ``cols[:, grp] @ other`` (``other`` [k_h*k_w*Cg, cols]), for :func:`_columns`' one matrix or two halves;
    ``other``: int8 or int16 codes."""
    dim = 0 if other_first else 1  # the axis of `other` that the product keeps
    mm = (lambda a, c: int_mm(a, c)) if other_first else (lambda a, c: int_mm(c, a))  # noqa: E731
    if other.dtype == torch.int16:
        parts = _with_ones(other, dim)
        product = lambda c: _recombine(mm(parts, c), other.shape[dim], dim)  # noqa: E731
    else:
        product = lambda c: mm(other, c).to(torch.int64)  # noqa: E731
    if len(cols) == 1:
        return product(cols[0][:, grp])
    hi, lo = (product(c[:, grp]) for c in cols)
    return 256 * hi + lo + 128 * other.sum(1 - dim, keepdim=True, dtype=torch.int64)


def _per_channel(scale: Tensor, n: int) -> Tensor:
    return scale.reshape(-1).to(torch.float32).expand(n) if scale.numel() == 1 else scale.reshape(-1).float()


def conv2d_forward(xq: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, geom: ConvGeometry) -> Tensor:
    """``conv2d(xq, wq) * x_scale * w_scale[co]`` as float32 (channels-last memory)."""
    xq = unshift_u8(xq)
    n = xq.shape[0]
    co, cg, k_h, k_w = wq.shape
    g = geom.groups
    cols, ho, wo = _columns(xq, k_h, k_w, geom)
    # weights as [G, k_h*k_w*Cg, Cog]: column (kh, kw, c) order matches the im2col rows
    wmat = weight_matrix(wq, g)
    acc = torch.cat([_columns_product(cols, grp, wmat[grp], False).to(torch.float64) for grp in range(g)], dim=1)
    y = acc * (_per_channel(w_scale, co).double() * float(x_scale.reshape(-1)[0]))
    return y.to(torch.float32).reshape(n, ho, wo, co).permute(0, 3, 1, 2)


def conv2d_input_grad(
    gq: Tensor, g_scale: Tensor, wq: Tensor, w_scale: Tensor, input_shape: tuple, geom: ConvGeometry
) -> Tensor:
    """``conv_transpose2d(gq, wq) * g_scale * w_scale[ci]`` as float32 ``input_shape``.

    A transposed convolution is a stride-1 convolution of the zero-inserted gradient with the
    flipped, group-transposed weight (zeros add nothing to the integer sums).
    """
    gq = unshift_u8(gq)
    n, cin, h, w = (int(v) for v in input_shape)
    co, cgi, k_h, k_w = wq.shape
    (sh, sw), (ph, pw), (dh, dw), g = geom.stride, geom.padding, geom.dilation, geom.groups
    ho, wo = gq.shape[2], gq.shape[3]
    up = gq.new_zeros((n, co, (ho - 1) * sh + 1, (wo - 1) * sw + 1))
    up[:, :, ::sh, ::sw] = gq
    # full padding d*(k-1) - p on each side, plus the rows/cols a strided forward dropped at the end
    pad_t, pad_l = dh * (k_h - 1) - ph, dw * (k_w - 1) - pw
    extra_h = h - ((ho - 1) * sh + 1 + 2 * pad_t - dh * (k_h - 1))
    extra_w = w - ((wo - 1) * sw + 1 + 2 * pad_l - dw * (k_w - 1))
    up = F.pad(up, (max(pad_l, 0), max(pad_l, 0) + extra_w, max(pad_t, 0), max(pad_t, 0) + extra_h))
    up = up[:, :, max(-pad_t, 0) : up.shape[2] - max(-pad_t, 0), max(-pad_l, 0) : up.shape[3] - max(-pad_l, 0)]
    wt = wq.reshape(g, co // g, cgi, k_h, k_w).transpose(1, 2).reshape(g * cgi, co // g, k_h, k_w).flip(2, 3)
    geom_t = ConvGeometry((1, 1), (0, 0), (dh, dw), g)
    return conv2d_forward(up, g_scale, wt.contiguous(), w_scale, geom_t)


def conv2d_weight_grad(
    gq: Tensor, g_scale: Tensor, xq: Tensor, x_scale: Tensor, weight_shape: tuple, geom: ConvGeometry
) -> Tensor:
    """``sum_{n,h,w} gq * im2col(xq) * g_scale[co] * x_scale`` as float32 ``weight_shape``."""
    xq = unshift_u8(xq)
    co, cg, k_h, k_w = (int(v) for v in weight_shape)
    g = geom.groups
    cols, _, _ = _columns(xq, k_h, k_w, geom)
    gmat = gq.permute(0, 2, 3, 1).reshape(-1, co)  # [N*Ho*Wo, Co]
    cog = co // g
    parts = [_columns_product(cols, grp, gmat[:, grp * cog : (grp + 1) * cog].t(), True) for grp in range(g)]
    acc = torch.cat(parts).to(torch.float64).reshape(co, k_h, k_w, cg).permute(0, 3, 1, 2)
    scale = _per_channel(g_scale, co).double() * float(x_scale.reshape(-1)[0])
    return (acc * scale.view(co, 1, 1, 1)).to(torch.float32)
