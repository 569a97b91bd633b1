"""The AMX convolution kernels (forward at stride 1 in ``conv_amx.c``; weight gradient at stride 1 with Ci a
multiple of 16 in ``conv.c``): exact against the int64 references for every tile tail, padding, kernel shape and
thread count, and the paths the library takes on CPUs with AMX (these tests skip elsewhere)."""

from __future__ import annotations

import pytest
import torch

from inttrain.kernels import conv as K
from inttrain.kernels import conv_reference as R
from inttrain.kernels import native
from inttrain.kernels.conv_geometry import ConvGeometry
from inttrain.kernels.fused import quantize_matrix
from inttrain.spec import PerChannel, QuantSpec, Rounding
from inttrain.spec.formats import IntFormat

needs_amx_fwd = pytest.mark.skipif(native.conv_kernel("forward", 16, (1, 1), (1, 1)) != "amx",
                                   reason=f"AMX convolution unavailable: {native.CONV_AMX_LIBRARY.reason}")
needs_amx_wgrad = pytest.mark.skipif(native.conv_kernel("weight_grad", 16, (1, 1), (1, 1)) != "amx",
                                     reason="AMX weight gradient unavailable (no AMX-INT8 or no native library)")
ONE = torch.ones(1)

# (n, ci, co, h, w, (kh, kw), (pad_h, pad_w)): 1/2/3 64-byte steps per kernel row (Ci*KW of 12 to 216 bytes),
# 1 to 5 output-channel tiles with partial ones (5, 17, 33, 80), 2 x 2 units at an odd tile count (48),
# grids that end mid-tile, 1x1 images, padding past the kernel, non-square kernels.
FORWARD = [
    (2, 4, 16, 9, 10, (3, 3), (1, 1)), (3, 16, 16, 8, 8, (3, 3), (1, 1)), (2, 32, 32, 16, 16, (3, 3), (1, 1)),
    (2, 64, 64, 8, 8, (3, 3), (1, 1)), (1, 16, 48, 5, 7, (3, 3), (1, 1)), (2, 20, 5, 6, 9, (1, 3), (0, 1)),
    (1, 3, 17, 7, 5, (2, 3), (1, 0)), (2, 72, 33, 4, 4, (3, 3), (2, 2)), (1, 8, 80, 1, 1, (1, 1), (0, 0)),
    (2, 16, 32, 1, 1, (3, 3), (1, 1)), (1, 12, 16, 11, 13, (5, 5), (2, 2)), (2, 1, 1, 6, 6, (1, 7), (0, 3)),
]


def _x_codes(shape: tuple, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)


@needs_amx_fwd
@pytest.mark.parametrize("geometry", FORWARD)
def test_forward_exact_against_the_reference(geometry: tuple) -> None:
    n, ci, co, h, w, k, p = geometry
    gen = torch.Generator().manual_seed(hash(geometry) % 2**31)
    xq, wq = _x_codes((n, ci, h, w), gen), _x_codes((co, ci, *k), gen)
    want = R.conv2d_forward(xq, ONE, wq, ONE, ConvGeometry((1, 1), p, (1, 1), 1))
    xu8 = K.to_shifted_u8(xq).contiguous(memory_format=torch.channels_last)
    for threads in (1, 2, 3):
        got = native.conv2d_forward_u8s8(xu8, 1.0, wq, ONE, (1, 1), p, (1, 1), threads=threads)
        assert got.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(got, want), threads


@needs_amx_fwd
def test_forward_scales_like_the_vnni_kernel() -> None:
    # float32(sum) * float32(x_scale * w_scale[co]) (the scale rounded once from double): what conv.c computes
    gen = torch.Generator().manual_seed(3)
    xq, wq = _x_codes((2, 32, 6, 6), gen), _x_codes((24, 32, 3, 3), gen)
    ws = torch.rand(24, generator=gen) + 0.01
    sums = R.conv2d_forward(xq, ONE, wq, ONE, ConvGeometry((1, 1), (1, 1), (1, 1), 1))
    want = sums * (torch.tensor(0.037).double() * ws.double()).float().reshape(1, -1, 1, 1)
    got = native.conv2d_forward_u8s8(K.to_shifted_u8(xq), 0.037, wq, ws, (1, 1), (1, 1), (1, 1))
    assert torch.equal(got, want)


@needs_amx_fwd
@pytest.mark.parametrize("geometry", FORWARD[:6])
def test_forward_writes_bfloat16_as_the_float32_result_rounded(geometry: tuple) -> None:
    n, ci, co, h, w, k, p = geometry
    gen = torch.Generator().manual_seed(17)
    xq, wq = _x_codes((n, ci, h, w), gen), _x_codes((co, ci, *k), gen)
    ws = torch.rand(co, generator=gen) * 1e-3 + 1e-4  # values whose bfloat16 rounding is not exact
    xu8 = K.to_shifted_u8(xq).contiguous(memory_format=torch.channels_last)
    want = native.conv2d_forward_u8s8(xu8, 0.013, wq, ws, (1, 1), p, (1, 1)).to(torch.bfloat16)
    for threads in (1, 2):
        got = native.conv2d_forward_u8s8(xu8, 0.013, wq, ws, (1, 1), p, (1, 1), threads, out_dtype=torch.bfloat16)
        assert got.dtype == torch.bfloat16 and got.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(got, want), threads


@needs_amx_fwd
def test_forward_longest_exact_reduction_does_not_overflow() -> None:
    # Ci * KH * KW = 65790 <= 65793 products of x = 255 (code 127) and w = -128: the int32 sums' limit
    ci = 7310
    xq = torch.full((1, ci, 3, 3), 127, dtype=torch.int8)
    wq = torch.full((2, ci, 3, 3), -128, dtype=torch.int8)
    got = native.conv2d_forward_u8s8(K.to_shifted_u8(xq), 1.0, wq, ONE, (1, 1), (0, 0), (1, 1))
    assert got.shape == (1, 2, 1, 1)
    assert torch.equal(got.double(), torch.full((1, 2, 1, 1), 65790 * 127 * -128.0, dtype=torch.float64))


@needs_amx_fwd
def test_input_gradient_runs_on_amx_and_stays_exact() -> None:
    gen = torch.Generator().manual_seed(5)
    gq, wq = _x_codes((3, 32, 8, 8), gen), _x_codes((32, 16, 3, 3), gen)
    geom = ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    got = K.conv2d_input_grad(gq, ONE, wq, ONE, (3, 16, 8, 8), geom)
    assert torch.equal(got, R.conv2d_input_grad(gq, ONE, wq, ONE, (3, 16, 8, 8), geom))


def _wgrad_reference(gq: torch.Tensor, xq: torch.Tensor, shape: tuple, pad: tuple, dil: tuple) -> torch.Tensor:
    return torch.nn.grad.conv2d_weight(xq.double(), shape, gq.double(), padding=pad, dilation=dil).long()


# (n, ci, co, h, w, (kh, kw), pad, dilation): 1 to 4 16-channel tiles of Ci, output-channel tiles paired, single
# and partial (5, 17, 33, 48); tap rows for 2 x 2, 4 x 1 and single blocks; grids of one 64-pixel step and many,
# 1x1 images, dilation, non-square kernels.
WGRAD = [
    (3, 16, 16, 9, 9, (3, 3), (1, 1), (1, 1)), (2, 32, 17, 7, 8, (3, 3), (1, 1), (1, 1)),
    (2, 16, 48, 10, 10, (3, 3), (2, 2), (2, 2)), (1, 48, 5, 6, 6, (1, 1), (0, 0), (1, 1)),
    (2, 64, 64, 8, 8, (3, 3), (1, 1), (1, 1)), (4, 16, 33, 13, 11, (5, 5), (2, 2), (1, 1)),
    (2, 32, 32, 1, 1, (3, 3), (1, 1), (1, 1)), (2, 16, 16, 12, 5, (1, 3), (0, 1), (1, 2)),
    (1, 16, 32, 33, 31, (3, 3), (1, 1), (1, 1)),
]


@needs_amx_wgrad
@pytest.mark.parametrize("geometry", WGRAD)
@pytest.mark.parametrize("layout", ["nchw q", "nchw q+128", "channels-last q", "channels-last q+128"])
def test_weight_grad_exact_against_the_reference(geometry: tuple, layout: str) -> None:
    channels_last, shifted = layout.startswith("channels-last"), layout.endswith("q+128")
    n, ci, co, h, w, k, p, d = geometry
    assert native.conv_kernel("weight_grad", ci, (1, 1), d) == "amx"
    gen = torch.Generator().manual_seed(hash(geometry) % 2**31)
    ho, wo = h + 2 * p[0] - d[0] * (k[0] - 1), w + 2 * p[1] - d[1] * (k[1] - 1)
    xq, gq = _x_codes((n, ci, h, w), gen), _x_codes((n, co, ho, wo), gen)
    if channels_last:
        xq, gq = xq.contiguous(memory_format=torch.channels_last), gq.contiguous(memory_format=torch.channels_last)
    want = _wgrad_reference(gq, xq, (co, ci, *k), p, d)
    x_in = K.to_shifted_u8(xq) if shifted else xq
    for threads in (1, 2, 3):
        got = native.conv2d_weight_grad_int(gq, x_in, (co, ci, *k), (1, 1), p, d, threads=threads)
        assert torch.equal(got, want), threads


@needs_amx_wgrad
@pytest.mark.parametrize("threads", [1, 2])
def test_weight_grad_int32_sums_flushed_before_overflow(threads: int) -> None:
    # 70 images x 1024 pixels of g = -128 and x = 127 (read as 255): 71680 products of -32640 per sum, which one
    # int32 would not hold without the flush to int64 between image chunks
    gq = torch.full((70, 16, 32, 32), -128, dtype=torch.int8)
    xq = torch.full((70, 16, 32, 32), 127, dtype=torch.int8)
    got = native.conv2d_weight_grad_int(gq, xq, (16, 16, 1, 1), (1, 1), (0, 0), (1, 1), threads=threads)
    assert torch.equal(got, torch.full((16, 16, 1, 1), 70 * 32 * 32 * -128 * 127, dtype=torch.int64))


@needs_amx_wgrad
@pytest.mark.parametrize("rounding", [Rounding.NEAREST_EVEN, Rounding.STOCHASTIC])
def test_weight_grad_of_a_float_gradient_equals_its_codes(rounding: Rounding) -> None:
    gen = torch.Generator().manual_seed(11)
    xu8 = K.to_shifted_u8(_x_codes((3, 32, 10, 10), gen)).contiguous(memory_format=torch.channels_last)
    dy = (torch.randn((3, 24, 10, 10), generator=gen) * torch.rand((1, 24, 1, 1), generator=gen))
    dy = dy.contiguous(memory_format=torch.channels_last)
    spec, seed = QuantSpec(IntFormat(8), PerChannel(), rounding), 0xC0FFEE
    codes, scale = quantize_matrix(dy.permute(0, 2, 3, 1).reshape(-1, 24).contiguous(), spec, 1, seed=seed)
    gq = codes.reshape(3, 10, 10, 24).permute(0, 3, 1, 2)
    want = native.conv2d_weight_grad_int(gq, xu8, (24, 32, 3, 3), (1, 1), (1, 1), (1, 1))
    got = native.conv2d_weight_grad_float(dy, scale, 127, rounding is Rounding.STOCHASTIC, seed, xu8,
                                          (24, 32, 3, 3), (1, 1), (1, 1), (1, 1))
    assert torch.equal(got, want)


@needs_amx_fwd
def test_paths_chosen_by_geometry() -> None:
    assert native.conv_kernel("forward", 3, (1, 1), (1, 1)) == "amx"
    assert native.conv_kernel("forward", 16, (2, 2), (1, 1)) == "vnni"
    assert native.conv_kernel("forward", 16, (1, 1), (2, 2)) == "vnni"
    assert native.conv_kernel("weight_grad", 8, (1, 1), (1, 1)) == "vnni"
    assert native.conv_kernel("weight_grad", 16, (2, 1), (1, 1)) == "vnni"
    with pytest.raises(ValueError, match="kind must be"):
        native.conv_kernel("backward", 16, (1, 1), (1, 1))
