"""The AVX2 int8 convolution (``conv_avx2.c``; forward, and the input gradient's sub-pixel convolution): exact
against the int64 reference for every tile shape, stride, padding, dilation and channel count it takes, at the
int32 bound, at 1 and 2 threads (these tests skip on CPUs without AVX2, with the library's reason)."""

from __future__ import annotations

import pytest
import torch
from conv_utils import forward_and_input_grad_exact

from inttrain.kernels import conv as K
from inttrain.kernels import conv_reference as R
from inttrain.kernels import native
from inttrain.kernels.conv_geometry import ConvGeometry
from inttrain.kernels.fused import quantize_matrix
from inttrain.spec import PerChannel, PerTensor, QuantSpec, Rounding
from inttrain.spec.formats import IntFormat

pytestmark = pytest.mark.skipif(native.CONV_AVX2_LIBRARY.load() is None,
                                reason=f"AVX2 convolution unavailable: {native.CONV_AVX2_LIBRARY.reason}")
ONE = torch.ones(1)

# (n, ci, co, h, w, k, stride, pad, dilation): both register tiles (Co a multiple of 16: 8 x 2 channels by 6
# pixels; else 8 channels by 12 pixels) and partial channel blocks (13, 20, 3), odd and RGB input channels (the
# zero channel that completes a pair), a pixel count that is no multiple of the tile's, strides 1-3, no padding,
# padding past the kernel, dilation, 1x1, 2x2 and 5x5
GEOMETRIES = [
    (2, 16, 16, 9, 10, 3, 1, 1, 1), (3, 3, 16, 7, 8, 3, 1, 1, 1), (2, 5, 13, 9, 7, 3, 2, 1, 1),
    (1, 32, 64, 6, 6, 3, 2, 1, 1), (2, 8, 24, 11, 10, 5, 1, 2, 2), (2, 16, 32, 8, 8, 1, 2, 0, 1),
    (1, 7, 3, 5, 5, 2, 1, 0, 1), (2, 12, 20, 11, 12, 5, 3, 2, 2), (1, 4, 1, 3, 3, 3, 1, 3, 1), (2, 1, 8, 6, 5, 3, 1, 1, 1),
]


def _codes(n: int, ci: int, co: int, h: int, w: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    xq = torch.randint(-128, 128, (n, ci, h, w), dtype=torch.int16, generator=gen).to(torch.int8)
    wq = torch.randint(-128, 128, (co, ci, k, k), dtype=torch.int16, generator=gen).to(torch.int8)
    return xq, wq


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_exact_against_the_reference(geometry: tuple, threads: int) -> None:
    n, ci, co, h, w, k, s, p, d = geometry
    xq, wq = _codes(n, ci, co, h, w, k, seed=sum(geometry))
    geom = ConvGeometry((s, s), (p, p), (d, d), 1)
    xu8 = K.to_shifted_u8(xq).contiguous(memory_format=torch.channels_last)
    y = native.conv2d_forward_avx2(xu8, 1.0, wq, ONE, (s, s), (p, p), (d, d), threads=threads)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y, R.conv2d_forward(xq, ONE, wq, ONE, geom))
    # real scales: float32(sum) * float32(x_scale * w_scale[co]), the VNNI kernel's epilogue bit for bit
    xs, ws = torch.tensor([0.0123]), torch.rand(co, generator=torch.Generator().manual_seed(1)) + 0.01
    got = native.conv2d_forward_avx2(xu8, float(xs), wq, ws, (s, s), (p, p), (d, d), threads=threads)
    scale = (xs.double() * ws.double()).float().reshape(1, -1, 1, 1)
    assert torch.equal(got, R.conv2d_forward(xq, ONE, wq, ONE, geom) * scale)


def test_extreme_codes_at_the_int32_bound() -> None:
    """-128 x -128 in every product (2^14) over a reduction at the int32 bound (14562 channels x 9 taps = 131058
    terms; 131071 is the most int32 holds), and one channel pair more is refused."""
    ci = 14562
    xq = torch.full((1, ci, 3, 3), -128, dtype=torch.int8)
    wq = torch.full((2, ci, 3, 3), -128, dtype=torch.int8)
    y = native.conv2d_forward_avx2(K.to_shifted_u8(xq), 1.0, wq, ONE, (1, 1), (0, 0), (1, 1))
    assert y.flatten().tolist() == [ci * 9 * 16384] * 2
    wide = torch.zeros((2, ci + 2, 3, 3), dtype=torch.int8)
    with pytest.raises(ValueError, match="does not fit int32 exactly"):
        native.conv2d_forward_avx2(K.to_shifted_u8(torch.zeros((1, ci + 2, 3, 3), dtype=torch.int8)), 1.0, wide,
                                   ONE, (1, 1), (0, 0), (1, 1))
    assert not native.avx2_conv_preferred(1, (ci + 2) * 9)


def test_any_input_layout_empty_batch_and_bfloat16() -> None:
    xq, wq = _codes(2, 8, 16, 6, 6, 3, seed=3)
    nchw = K.to_shifted_u8(xq)  # contiguous NCHW: copied to channels-last inside
    geom = ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    want = R.conv2d_forward(xq, ONE, wq, ONE, geom)
    assert torch.equal(native.conv2d_forward_avx2(nchw, 1.0, wq, ONE, (1, 1), (1, 1), (1, 1)), want)
    bf = native.conv2d_forward_avx2(nchw, 1.0, wq, ONE, (1, 1), (1, 1), (1, 1), out_dtype=torch.bfloat16)
    assert bf.dtype == torch.bfloat16 and torch.equal(bf, want.to(torch.bfloat16))
    assert native.conv2d_forward_avx2(nchw[:0], 1.0, wq, ONE, (1, 1), (1, 1), (1, 1)).shape == (0, 16, 6, 6)
    with pytest.raises(TypeError, match="expected CPU uint8 codes and int8 weights"):
        native.conv2d_forward_avx2(xq, 1.0, wq, ONE, (1, 1), (1, 1), (1, 1))


@pytest.mark.parametrize("stride", [1, 2])
def test_layer_kernels_use_it_and_stay_exact(stride: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where it is preferred (forced here, so this runs on every AVX2 CPU), kernels.conv's forward and input
    gradient (a sub-pixel convolution) run on it -- the RGB layer's 3 channels too -- and match the reference."""
    calls = []
    real = native.conv2d_forward_avx2
    monkeypatch.setattr(native, "conv_forward_supported", lambda *a: False)  # not the VNNI kernel
    monkeypatch.setattr(native, "avx2_conv_preferred", lambda *a: True)
    monkeypatch.setattr(native, "conv2d_forward_avx2", lambda *a, **k: calls.append(1) or real(*a, **k))
    for ci in (16, 3):
        forward_and_input_grad_exact(*_codes(2, ci, 32, 9, 9, 3, seed=7 + ci), stride)
    assert len(calls) == 4


def test_preferred_only_without_an_int8_dot_product() -> None:
    """The kernel is this machine's convolution exactly where the AVX2 GEMM is its GEMM (no VNNI), ungrouped."""
    assert native.avx2_conv_preferred(1, 16 * 9) == native.avx2_gemm_preferred()
    assert not native.avx2_conv_preferred(2, 16 * 9)


def _weight_grad_reference(gq: torch.Tensor, xq: torch.Tensor, weight_shape: tuple, geom: ConvGeometry) -> torch.Tensor:
    """The exact int64 sums (float64 convolution of the codes: exact below 2^53)."""
    w = torch.zeros(weight_shape, dtype=torch.float64)
    dw = torch.ops.aten.convolution_backward(gq.double(), xq.double(), w, None, list(geom.stride), list(geom.padding),
                                             list(geom.dilation), False, [0, 0], 1, [False, True, False])[1]
    return dw.to(torch.int64)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("geometry", GEOMETRIES + [(5, 64, 48, 5, 6, 3, 1, 1, 1), (3, 24, 8, 6, 7, 3, 1, 1, 1)])
def test_weight_grad_exact_against_the_reference(geometry: tuple, threads: int) -> None:
    """Pixel pairs with an odd row length (a zero second pixel), channel counts that are no multiple of the tiles'
    (4 output, 8/16/24 input channels), both input codings (the forward's shifted uint8 and int8), any layout."""
    n, ci, co, h, w, k, s, p, d = geometry
    xq, wq = _codes(n, ci, co, h, w, k, seed=sum(geometry) + 1)
    geom = ConvGeometry((s, s), (p, p), (d, d), 1)
    ho, wo = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
    gq = torch.randint(-128, 128, (n, co, ho, wo), dtype=torch.int16,
                       generator=torch.Generator().manual_seed(n)).to(torch.int8)
    want = _weight_grad_reference(gq, xq, tuple(wq.shape), geom)
    for x in (K.to_shifted_u8(xq).contiguous(memory_format=torch.channels_last), xq):
        got = native.conv2d_weight_grad_avx2(gq, x, tuple(wq.shape), (s, s), (p, p), (d, d), threads=threads)
        assert got.dtype == torch.int64 and torch.equal(got, want)


def test_weight_grad_extreme_codes_past_one_int32_flush() -> None:
    """-128 x -128 everywhere over 600 images of 16x16 pixels (153600 products of 2^14 a sum: past int32, so the
    kernel's per-chunk flushes to int64 must carry it), and an empty batch."""
    xq = torch.full((600, 8, 16, 16), -128, dtype=torch.int8)
    gq = torch.full((600, 4, 16, 16), -128, dtype=torch.int8)
    got = native.conv2d_weight_grad_avx2(gq, K.to_shifted_u8(xq), (4, 8, 1, 1), (1, 1), (0, 0), (1, 1))
    assert got.flatten().tolist() == [600 * 256 * 16384] * 32
    empty = native.conv2d_weight_grad_avx2(gq[:0], xq[:0], (4, 8, 3, 3), (1, 1), (1, 1), (1, 1))
    assert empty.shape == (4, 8, 3, 3) and not empty.any()


def test_layer_weight_grad_uses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where it is preferred (forced here), kernels.conv's weight gradient runs on it and matches the reference."""
    calls = []
    real = native.conv2d_weight_grad_avx2
    monkeypatch.setattr(native, "available", lambda: False)  # not the VNNI kernel
    monkeypatch.setattr(native, "avx2_conv_preferred", lambda *a: True)
    monkeypatch.setattr(native, "conv2d_weight_grad_avx2", lambda *a, **k: calls.append(1) or real(*a, **k))
    xq, wq = _codes(3, 16, 32, 9, 9, 3, seed=11)
    geom = ConvGeometry((2, 2), (1, 1), (1, 1), 1)
    gq = torch.randint(-128, 128, (3, 32, 5, 5), dtype=torch.int16).to(torch.int8)
    got = K.conv2d_weight_grad(gq, ONE, K.to_shifted_u8(xq), ONE, tuple(wq.shape), geom)
    assert torch.equal(got, R.conv2d_weight_grad(gq, ONE, xq, ONE, tuple(wq.shape), geom))
    assert calls == [1]


def _float_gradient(geometry: tuple, seed: int, dtype: torch.dtype) -> tuple:
    n, ci, co, h, w, k, s, p, d = geometry
    xq, _ = _codes(n, ci, co, h, w, k, seed)
    geom = ConvGeometry((s, s), (p, p), (d, d), 1)
    ho, wo = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
    gen = torch.Generator().manual_seed(seed)
    dy = (torch.randn((n, co, ho, wo), generator=gen) * torch.rand((1, co, 1, 1), generator=gen)).to(dtype)
    return xq, dy, geom, (co, ci, k, k)


@pytest.mark.parametrize("geometry", GEOMETRIES[:6])
@pytest.mark.parametrize("rounding", [Rounding.NEAREST_EVEN, Rounding.STOCHASTIC])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_weight_grad_equals_quantize_matrix_then_the_code_kernel(
        geometry: tuple, rounding: Rounding, per_channel: bool, dtype: torch.dtype) -> None:
    """The codes made while packing are quantize_matrix's on dy's channels-last [N*Ho*Wo, Co] rows, bit for bit
    (nearest-even and the stochastic-rounding hash, per channel and per tensor, float32 and bfloat16 dy)."""
    xq, dy, geom, wshape = _float_gradient(geometry, sum(geometry), dtype)
    spec = QuantSpec(IntFormat(8), PerChannel() if per_channel else PerTensor(), rounding)
    seed = 0xDEADBEEF
    rows = dy.float().permute(0, 2, 3, 1).reshape(-1, dy.shape[1]).contiguous()
    codes, scale = quantize_matrix(rows, spec, 1, seed=seed)
    gq = codes.reshape(dy.shape[0], dy.shape[2], dy.shape[3], -1).permute(0, 3, 1, 2)
    xu8 = K.to_shifted_u8(xq)
    want = native.conv2d_weight_grad_avx2(gq, xu8, wshape, geom.stride, geom.padding, geom.dilation)
    got = native.conv2d_weight_grad_float_avx2(dy, scale, 127, rounding is Rounding.STOCHASTIC, seed, xu8, wshape,
                                               geom.stride, geom.padding, geom.dilation)
    assert torch.equal(got, want)
    assert torch.equal(want, _weight_grad_reference(gq, xq, wshape, geom))


@pytest.mark.parametrize("bits", [4, 8])
def test_layer_float_weight_grad_uses_it_and_equals_the_torch_path(bits: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """kernels.conv's float-gradient weight gradient takes it where it is preferred (forced here) and gives the torch
    path's result bit for bit (stochastic rounding, 4- and 8-bit gradient codes)."""
    xq, dy, geom, wshape = _float_gradient(GEOMETRIES[2], 5, torch.float32)
    scale = torch.rand(wshape[0], generator=torch.Generator().manual_seed(2)) * 0.02 + 0.001
    xu8, sx, qmax = K.to_shifted_u8(xq), torch.tensor([0.02]), 2 ** (bits - 1) - 1
    calls = []
    real = native.conv2d_weight_grad_float_avx2
    monkeypatch.setattr(native, "available", lambda: False)  # not the VNNI kernel
    monkeypatch.setattr(native, "avx2_conv_preferred", lambda *a: False)
    slow = K.conv2d_weight_grad_float(dy, scale, qmax, True, 77, xu8, sx, wshape, geom)
    monkeypatch.setattr(native, "avx2_conv_preferred", lambda *a: True)
    monkeypatch.setattr(native, "conv2d_weight_grad_float_avx2", lambda *a, **k: calls.append(1) or real(*a, **k))
    fast = K.conv2d_weight_grad_float(dy, scale, qmax, True, 77, xu8, sx, wshape, geom)
    assert calls == [1] and fast.dtype == torch.float32 and torch.equal(fast, slow)


@pytest.mark.parametrize("float_gradient", [False, True])
@pytest.mark.parametrize("co", [1, 4, 12, 16])
def test_weight_grad_stays_inside_its_scratch(co: int, float_gradient: bool) -> None:
    """The kernel writes only the scratch it asks for: canary bytes right after it survive (a float gradient with
    Co no multiple of 8 once wrote 8-channel stores past the end and corrupted the heap)."""
    import ctypes

    lib = native.CONV_AVX2_LIBRARY.load()
    xq, _ = _codes(3, 8, co, 7, 6, 3, seed=co)
    dy = torch.randn((3, co, 7, 6)).contiguous(memory_format=torch.channels_last)
    gq = torch.randint(-128, 128, (3, co, 7, 6), dtype=torch.int16).to(torch.int8).contiguous(
        memory_format=torch.channels_last)
    xu8 = K.to_shifted_u8(xq).contiguous(memory_format=torch.channels_last)
    dims = native._int64_array([3, co, 8, 3, 3, 7, 6, 7, 6, 1, 1, 1, 1, 1, 1, 0])
    sizes = (ctypes.c_int64 * 2)()
    lib.inttrain_wgrad_avx2_scratch(dims, 1, sizes)  # one thread: its region is the last
    canary = 4096
    work = torch.full((int(sizes[0]) + canary,), 0x5A, dtype=torch.uint8)
    partial = torch.full((int(sizes[1]) + canary,), 0x5A, dtype=torch.uint8)
    out = torch.empty((co, 8, 3, 3), dtype=torch.int64)
    tail = (xu8.data_ptr(), dims, work.data_ptr(), partial.data_ptr(), out.data_ptr(), 1)
    if float_gradient:
        scale = torch.full((co,), 0.01)
        assert lib.inttrain_wgrad_f32_avx2(dy.data_ptr(), scale.data_ptr(), 1, 127, 1, 7, *tail) == 0
    else:
        assert lib.inttrain_wgrad_avx2(gq.data_ptr(), *tail) == 0
    assert bool((work[-canary:] == 0x5A).all()) and bool((partial[-canary:] == 0x5A).all())


def test_weight_grad_refuses_images_past_its_int32_bound() -> None:
    """An image of more than 65535 gradient pixel pairs could overflow an int32 lane before its flush: refused with
    a ValueError (and kernels.conv routes such layers elsewhere); 65535 pairs exactly are taken."""
    assert native.avx2_weight_grad_fits(1, 131070) and not native.avx2_weight_grad_fits(1, 131071)
    assert native.avx2_weight_grad_fits(65535, 1) and not native.avx2_weight_grad_fits(65536, 2)
    x = torch.zeros((1, 4, 1, 131072), dtype=torch.int8)
    g = torch.zeros((1, 4, 1, 131072), dtype=torch.int8)
    with pytest.raises(ValueError, match="more than 65535 pixel pairs"):
        native.conv2d_weight_grad_avx2(g, x, (4, 4, 1, 1), (1, 1), (0, 0), (1, 1))
    ok = native.conv2d_weight_grad_avx2(g[..., :131070], x[..., :131070], (4, 4, 1, 1), (1, 1), (0, 0), (1, 1))
    assert not ok.any()


def test_env_names_the_kernels_where_preferred(monkeypatch: pytest.MonkeyPatch) -> None:
    """``inttrain env`` (kernels.describe) names the AVX2 convolutions exactly where they are the CPU's."""
    import inttrain.kernels as kernels

    monkeypatch.setattr(native, "avx2_conv_preferred", lambda *a: True)
    info = kernels.describe()
    assert "conv_avx2.c" in info["conv2d forward/input grad (cpu)"]
    assert "conv_avx2.c" in info["conv2d weight grad (cpu)"]
    monkeypatch.setattr(native, "avx2_conv_preferred", lambda *a: False)
    info = kernels.describe()
    assert "conv_avx2.c" not in info["conv2d forward/input grad (cpu)"] + info["conv2d weight grad (cpu)"]


@pytest.mark.parametrize("geometry", [(40, 16, 16, 1), (33, 32, 12, 2)])
def test_weight_grad_many_chunks_across_threads(geometry: tuple) -> None:
    """Batches of several L2-sized image chunks, spread over 1-3 threads whose int64 partials are added at the end:
    exact for int8 codes, and the same for a float gradient whatever the thread count."""
    n, c, hw, s = geometry
    xq, _ = _codes(n, c, c, hw, hw, 3, seed=n)
    ho = (hw + 2 - 3) // s + 1
    gen = torch.Generator().manual_seed(c)
    gq = torch.randint(-128, 128, (n, c, ho, ho), dtype=torch.int16, generator=gen).to(torch.int8)
    dy = torch.randn((n, c, ho, ho), generator=gen)
    geom = ConvGeometry((s, s), (1, 1), (1, 1), 1)
    want = _weight_grad_reference(gq, xq, (c, c, 3, 3), geom)
    xu8, scale = K.to_shifted_u8(xq), torch.full((c,), 0.02)
    floats = []
    for threads in (1, 2, 3):
        got = native.conv2d_weight_grad_avx2(gq, xu8, (c, c, 3, 3), (s, s), (1, 1), (1, 1), threads=threads)
        assert torch.equal(got, want)
        floats.append(native.conv2d_weight_grad_float_avx2(dy, scale, 127, True, 9, xu8, (c, c, 3, 3), (s, s),
                                                           (1, 1), (1, 1), threads=threads))
    assert torch.equal(floats[0], floats[1]) and torch.equal(floats[0], floats[2])
