"""Device-generic exact int8 convolutions: im2col + the integer GEMM (``torch._int_mm``).

oneDNN's int8 convolution (:mod:`.conv`) exists only on CPU; on other devices (CUDA, where
``torch._int_mm`` runs on int8 tensor cores) these functions compute the same three convolutions
from an im2col matrix and :func:`~inttrain.kernels.matmul.int8_mm`, whose zero padding meets
cuBLASLt's shape rules and whose K-splitting keeps int32 exact.  They are slower than a native
convolution (the im2col copy is k_h x k_w times the activation) but exact, and they are tested
bit for bit against :mod:`.conv_reference` on CPU.

Signatures and results are those of :mod:`.conv`: float32 ``acc * scale_a * scale_b``.  Codes may also be
int16 (9..16-bit formats): :func:`~inttrain.kernels.matmul.int_mm` splits them into exact int8 halves, as
for Linear layers, so wide convolutions stay exact on int8 kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .conv_geometry import ConvGeometry
from .matmul import int_mm

__all__ = ["conv2d_forward", "conv2d_input_grad", "conv2d_weight_grad", "unshift_u8"]


def unshift_u8(codes: Tensor) -> Tensor:
    """Shifted uint8 codes ``q + 128`` back to int8 ``q`` (a sign-bit flip); signed codes pass through."""
    return codes if codes.dtype != torch.uint8 else torch.bitwise_xor(codes.view(torch.int8), -128)


def _out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _im2col(x: Tensor, k_h: int, k_w: int, geom: ConvGeometry) -> tuple[Tensor, int, int]:
    """int8 NCHW -> columns ``[N*Ho*Wo, G, k_h*k_w*Cg]`` (row = output pixel, col = (kh, kw, c) of one group)."""
    n, c, h, w = x.shape
    (sh, sw), (ph, pw), (dh, dw), g = geom.stride, geom.padding, geom.dilation, geom.groups
    xp = F.pad(x.permute(0, 2, 3, 1), (0, 0, pw, pw, ph, ph)).contiguous()  # zero-padded NHWC
    hp, wp = h + 2 * ph, w + 2 * pw
    ho, wo = _out_size(h, k_h, sh, ph, dh), _out_size(w, k_w, sw, pw, dw)
    cg = c // g
    patches = xp.as_strided(
        (n, ho, wo, g, k_h, k_w, cg), (hp * wp * c, sh * wp * c, sw * c, cg, dh * wp * c, dw * c, 1)
    )
    return patches.reshape(n * ho * wo, g, k_h * k_w * cg), ho, wo


def _per_channel(scale: Tensor, n: int) -> Tensor:
    return scale.reshape(-1).to(torch.float32).expand(n) if scale.numel() == 1 else scale.reshape(-1).float()


def conv2d_forward(xq: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, geom: ConvGeometry) -> Tensor:
    """``conv2d(xq, wq) * x_scale * w_scale[co]`` as float32 (channels-last memory)."""
    xq = unshift_u8(xq)
    n = xq.shape[0]
    co, cg, k_h, k_w = wq.shape
    g = geom.groups
    cols, ho, wo = _im2col(xq, k_h, k_w, geom)
    # weights as [G, k_h*k_w*Cg, Cog]: column (kh, kw, c) order matches the im2col rows
    wmat = wq.reshape(g, co // g, cg, k_h, k_w).permute(0, 3, 4, 2, 1).reshape(g, k_h * k_w * cg, co // g)
    acc = torch.cat([int_mm(cols[:, grp], wmat[grp]).to(torch.float64) for grp in range(g)], dim=1)
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
    cols, _, _ = _im2col(xq, k_h, k_w, geom)
    gmat = gq.permute(0, 2, 3, 1).reshape(-1, co)  # [N*Ho*Wo, Co]
    parts = [int_mm(gmat[:, grp * (co // g) : (grp + 1) * (co // g)].t(), cols[:, grp]) for grp in range(g)]
    acc = torch.cat(parts).to(torch.float64).reshape(co, k_h, k_w, cg).permute(0, 3, 1, 2)
    scale = _per_channel(g_scale, co).double() * float(x_scale.reshape(-1)[0])
    return (acc * scale.view(co, 1, 1, 1)).to(torch.float32)
