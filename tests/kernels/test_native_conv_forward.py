"""The native int8 convolution (forward, and the input gradient's sub-pixel convolution): exact against the int64
reference for every tile shape, stride, padding and dilation it takes; oneDNN for what it does not take."""

from __future__ import annotations

import pytest
import torch
from conv_utils import forward_and_input_grad_exact

from inttrain.kernels import conv as K
from inttrain.kernels import conv_reference as R
from inttrain.kernels import native
from inttrain.kernels.conv_geometry import ConvGeometry

needs_native = pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.LIBRARY.reason}")
ONE = torch.ones(1)

# (n, ci, co, h, w, k, stride, pad, dilation): 16/32/64-channel register tiles and partial ones (20, 48), the
# pixels-in-lanes kernel (Co <= 16 at stride 1; rows of 37 and 33 pixels: partial 16-pixel blocks), a pixel
# count that is no multiple of the tile's, strides 1-3, no padding, padding past the kernel, dilation, 1x1 and 5x5
GEOMETRIES = [
    (2, 4, 16, 9, 10, 3, 1, 1, 1), (3, 8, 20, 7, 8, 3, 2, 1, 1), (2, 16, 32, 8, 9, 3, 1, 1, 1),
    (2, 32, 64, 5, 6, 2, 1, 0, 2), (1, 64, 64, 6, 7, 3, 1, 2, 1), (2, 16, 48, 10, 11, 1, 2, 0, 1),
    (2, 12, 64, 11, 12, 5, 3, 2, 2), (1, 4, 1, 3, 3, 3, 1, 3, 1), (2, 8, 12, 5, 37, 3, 1, 2, 2), (1, 16, 16, 4, 33, 1, 1, 0, 1),
]


def _codes(n: int, ci: int, co: int, h: int, w: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    xq = torch.randint(-128, 128, (n, ci, h, w), dtype=torch.int16, generator=gen).to(torch.int8)
    wq = torch.randint(-128, 128, (co, ci, k, k), dtype=torch.int16, generator=gen).to(torch.int8)
    return xq, wq


def _float_epilogue(sums: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """The kernel's epilogue: float32 sums times the per-channel scale rounded once from double, in float32."""
    scale = (x_scale.double() * w_scale.double()).float().reshape(1, -1, 1, 1)
    return sums * scale


@needs_native
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_exact_against_the_reference(geometry: tuple) -> None:
    n, ci, co, h, w, k, s, p, d = geometry
    xq, wq = _codes(n, ci, co, h, w, k, seed=sum(geometry))
    geom = ConvGeometry((s, s), (p, p), (d, d), 1)
    xu8 = K.to_shifted_u8(xq).contiguous(memory_format=torch.channels_last)
    y = native.conv2d_forward_u8s8(xu8, 1.0, wq, ONE, (s, s), (p, p), (d, d))
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y, R.conv2d_forward(xq, ONE, wq, ONE, geom))
    # real scales: float32(sum) * float32(x_scale * w_scale[co]) in float32, bit for bit; within an ulp of the
    # reference's one rounding in double
    xs, ws = torch.tensor([0.0123]), torch.rand(co, generator=torch.Generator().manual_seed(1)) + 0.01
    got = native.conv2d_forward_u8s8(xu8, float(xs), wq, ws, (s, s), (p, p), (d, d))
    assert torch.equal(got, _float_epilogue(R.conv2d_forward(xq, ONE, wq, ONE, geom), xs, ws))
    want = R.conv2d_forward(xq, xs, wq, ws, geom)
    assert torch.all((got - want).abs() <= torch.finfo(torch.float32).eps * want.abs())


@needs_native
def test_extreme_codes_do_not_overflow() -> None:
    """All codes at their extremes (255 * -128 per product) over a 64-channel 3x3 reduction."""
    xq = torch.full((2, 64, 5, 5), 127, dtype=torch.int8)
    wq = torch.full((64, 64, 3, 3), -128, dtype=torch.int8)
    geom = ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    y = native.conv2d_forward_u8s8(K.to_shifted_u8(xq), 1.0, wq, ONE, (1, 1), (1, 1), (1, 1))
    assert torch.equal(y, R.conv2d_forward(xq, ONE, wq, ONE, geom))


@needs_native
def test_any_input_layout_and_empty_batch() -> None:
    xq, wq = _codes(2, 8, 16, 6, 6, 3, seed=3)
    nchw = K.to_shifted_u8(xq)  # contiguous NCHW: copied to channels-last inside
    geom = ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    assert torch.equal(native.conv2d_forward_u8s8(nchw, 1.0, wq, ONE, (1, 1), (1, 1), (1, 1)),
                       R.conv2d_forward(xq, ONE, wq, ONE, geom))
    empty = native.conv2d_forward_u8s8(nchw[:0], 1.0, wq, ONE, (1, 1), (1, 1), (1, 1))
    assert empty.shape == (0, 16, 6, 6)


def test_what_it_takes() -> None:
    """Ungrouped, input channels a multiple of 4, reductions int32 holds; the rest stays on oneDNN."""
    if native.available():
        assert native.conv_forward_supported(16, 3, 3, 1)
    assert not native.conv_forward_supported(3, 3, 3, 1)  # an RGB input layer
    assert not native.conv_forward_supported(16, 3, 3, 2)
    assert not native.conv_forward_supported(8192, 3, 3, 1)  # 73728 terms: past int32's bound


@needs_native
@pytest.mark.parametrize("stride", [1, 2])
def test_layer_kernels_use_it_and_stay_exact(stride: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """kernels.conv's forward and input gradient (a sub-pixel convolution) run natively and match the reference."""
    calls = []
    real = native.conv2d_forward_u8s8
    monkeypatch.setattr(native, "conv2d_forward_u8s8", lambda *a, **k: calls.append(1) or real(*a, **k))
    forward_and_input_grad_exact(*_codes(2, 16, 32, 9, 9, 3, seed=7), stride)
    assert len(calls) == 2


@needs_native
def test_rejects_wrong_dtypes() -> None:
    xq, wq = _codes(1, 4, 16, 4, 4, 3, seed=0)
    with pytest.raises(TypeError, match="expected CPU uint8 codes and int8 weights"):
        native.conv2d_forward_u8s8(xq, 1.0, wq, ONE, (1, 1), (1, 1), (1, 1))
