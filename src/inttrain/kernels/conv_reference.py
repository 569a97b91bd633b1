"""Exact reference int8 convolutions (the test oracle for :mod:`inttrain.kernels.conv`).

Everything here is computed in int64 with one explicit loop over kernel taps, so it
is obviously right and does not share code paths with the fast kernels (nor with
``torch.nn.functional.conv2d``, against which the tests check this module).  The
integer sums are exact; scales are applied afterwards in float64 and the result is
rounded once to float32.  With unit scales the output is therefore
``float32(exact integer sum)``, which the fast kernels must match bit for bit.

The signatures match :mod:`inttrain.kernels.conv` so callers can swap the modules.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .conv_geometry import ConvGeometry

__all__ = ["ConvGeometry", "conv2d_forward", "conv2d_input_grad", "conv2d_weight_grad"]


def _out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _tap_view(xp: Tensor, kh: int, kw: int, ho: int, wo: int, geom: ConvGeometry) -> Tensor:
    """The [N, C, Ho, Wo] slice of padded ``xp`` that meets kernel tap (kh, kw)."""
    (sh, sw), (dh, dw) = geom.stride, geom.dilation
    h0, w0 = kh * dh, kw * dw
    return xp[:, :, h0 : h0 + sh * (ho - 1) + 1 : sh, w0 : w0 + sw * (wo - 1) + 1 : sw]


def _per_channel(scale: Tensor, n: int) -> Tensor:
    return scale.reshape(-1).to(torch.float64).expand(n)


def _finish(acc: Tensor, scale: Tensor) -> Tensor:
    """int64 sums -> float64 * scale -> one rounding to float32."""
    return (acc.to(torch.float64) * scale).to(torch.float32)


def conv2d_forward(xq: Tensor, x_scale: Tensor, wq: Tensor, w_scale: Tensor, geom: ConvGeometry) -> Tensor:
    """y[n,co,h,w] = (sum xq*wq) * x_scale * w_scale[co], float32 NCHW."""
    n, cin, h, w = xq.shape
    co, cig, k_h, k_w = wq.shape
    g = geom.groups
    ho = _out_size(h, k_h, geom.stride[0], geom.padding[0], geom.dilation[0])
    wo = _out_size(w, k_w, geom.stride[1], geom.padding[1], geom.dilation[1])
    ph, pw = geom.padding
    xp = torch.nn.functional.pad(xq.to(torch.int64), (pw, pw, ph, ph))
    w5 = wq.to(torch.int64).reshape(g, co // g, cig, k_h, k_w)
    acc = torch.zeros(n, g, co // g, ho, wo, dtype=torch.int64)
    for kh in range(k_h):
        for kw in range(k_w):
            xs = _tap_view(xp, kh, kw, ho, wo, geom).reshape(n, g, cig, ho, wo)
            acc += torch.einsum("ngchw,goc->ngohw", xs, w5[:, :, :, kh, kw])
    scale = x_scale.to(torch.float64).reshape(()) * _per_channel(w_scale, co)
    return _finish(acc.reshape(n, co, ho, wo), scale.view(1, co, 1, 1))


def conv2d_input_grad(
    gq: Tensor, g_scale: Tensor, wq: Tensor, w_scale: Tensor, input_shape: tuple, geom: ConvGeometry
) -> Tensor:
    """dx[n,ci,h,w] = (sum_{co,taps} gq*wq) * g_scale * w_scale[ci], float32 [N,Cin,H,W]."""
    n, cin, h, w = input_shape
    co, cig, k_h, k_w = wq.shape
    g = geom.groups
    ho, wo = gq.shape[2], gq.shape[3]
    ph, pw = geom.padding
    dxp = torch.zeros(n, cin, h + 2 * ph, w + 2 * pw, dtype=torch.int64)
    g5 = gq.to(torch.int64).reshape(n, g, co // g, ho, wo)
    w5 = wq.to(torch.int64).reshape(g, co // g, cig, k_h, k_w)
    for kh in range(k_h):
        for kw in range(k_w):
            contrib = torch.einsum("ngohw,goc->ngchw", g5, w5[:, :, :, kh, kw])
            _tap_view(dxp, kh, kw, ho, wo, geom).add_(contrib.reshape(n, cin, ho, wo))
    acc = dxp[:, :, ph : ph + h, pw : pw + w]
    scale = g_scale.to(torch.float64).reshape(()) * _per_channel(w_scale, cin)
    return _finish(acc, scale.view(1, cin, 1, 1))


def conv2d_weight_grad(
    gq: Tensor, g_scale: Tensor, xq: Tensor, x_scale: Tensor, weight_shape: tuple, geom: ConvGeometry
) -> Tensor:
    """dW[co,ci,kh,kw] = (sum_{n,h,w} gq*xq_shifted) * g_scale[co] * x_scale, float32."""
    co, cig, k_h, k_w = weight_shape
    n, cin, h, w = xq.shape
    g = geom.groups
    ho, wo = gq.shape[2], gq.shape[3]
    ph, pw = geom.padding
    xp = torch.nn.functional.pad(xq.to(torch.int64), (pw, pw, ph, ph))
    g5 = gq.to(torch.int64).reshape(n, g, co // g, ho, wo)
    acc = torch.zeros(g, co // g, cig, k_h, k_w, dtype=torch.int64)
    for kh in range(k_h):
        for kw in range(k_w):
            xs = _tap_view(xp, kh, kw, ho, wo, geom).reshape(n, g, cig, ho, wo)
            acc[:, :, :, kh, kw] = torch.einsum("ngohw,ngchw->goc", g5, xs)
    scale = _per_channel(g_scale, co) * x_scale.to(torch.float64).reshape(())
    return _finish(acc.reshape(co, cig, k_h, k_w), scale.view(co, 1, 1, 1))
