"""Wide-code convolutions on the int8 kernels (``kernels.conv_wide``): int16 codes split into rounded int8
halves give the int64 reference's result bit for bit in all three convolutions, across geometries, widths,
reductions long enough to be chunked, and the 16-bit codes that fall back to the generic path."""

from __future__ import annotations

import pytest
import torch

from inttrain.kernels import conv_reference, conv_wide, int_kernel_calls, native, reset_kernel_calls
from inttrain.kernels.conv_geometry import ConvGeometry

GEOMS = [ConvGeometry((1, 1), (1, 1), (1, 1), 1), ConvGeometry((2, 2), (1, 0), (1, 2), 1),
         ConvGeometry((1, 2), (0, 1), (1, 1), 2)]


def _codes(bits: int, shape: tuple[int, ...], g: torch.Generator, top: int | None = None) -> torch.Tensor:
    hi = top if top is not None else 2 ** (bits - 1) - 1
    q = torch.randint(-hi, hi + 1, shape, generator=g)
    q.view(-1)[0] = -hi  # the extremes, so the widest products are in every test
    q.view(-1)[-1] = hi
    return q.to(torch.int16 if bits > 8 else torch.int8)


def _out_hw(geom: ConvGeometry, hw: tuple[int, int], k: int) -> tuple[int, int]:
    return tuple((hw[i] + 2 * geom.padding[i] - geom.dilation[i] * (k - 1) - 1) // geom.stride[i] + 1 for i in (0, 1))


def test_split_rounded_is_exact_over_its_whole_range() -> None:
    q = torch.arange(-32768, 32640, dtype=torch.int32).to(torch.int16)
    hi, lo = conv_wide.split_rounded(q)
    assert hi.dtype == lo.dtype == torch.int8
    assert torch.equal(256 * hi.to(torch.int32) + lo.to(torch.int32), q.to(torch.int32))
    zero_hi, zero_lo = conv_wide.split_rounded(torch.zeros(1, dtype=torch.int16))
    assert int(zero_hi) == int(zero_lo) == 0  # zero padding stays zero in both halves


@pytest.mark.parametrize("geom", GEOMS)
@pytest.mark.parametrize("bits_a,bits_b", [(9, 9), (12, 8), (8, 15), (16, 16)])
def test_forward_and_input_grad_equal_the_int64_reference(geom: ConvGeometry, bits_a: int, bits_b: int) -> None:
    g = torch.Generator().manual_seed(bits_a * 100 + bits_b)
    x = _codes(bits_a, (3, 8, 9, 7), g, top=32639 if bits_a == 16 else None)  # 16-bit: the splittable range
    w = _codes(bits_b, (6, 8 // geom.groups, 3, 3), g, top=32639 if bits_b == 16 else None)
    sx, sw = torch.tensor([0.01]), torch.rand(6, generator=g) + 0.1
    reset_kernel_calls()
    y = conv_wide.conv2d_forward(x, sx, w, sw, geom)
    assert torch.equal(y.contiguous(), conv_reference.conv2d_forward(x, sx, w, sw, geom))
    assert int_kernel_calls()["conv_fwd"] == (2 if bits_a > 8 else 1) * (2 if bits_b > 8 else 1)
    dy = _codes(bits_a, tuple(y.shape), g, top=32639 if bits_a == 16 else None)
    sw_in = torch.rand(8, generator=g) + 0.1
    dx = conv_wide.conv2d_input_grad(dy, sx, w, sw_in, tuple(x.shape), geom)
    assert torch.equal(dx.contiguous(), conv_reference.conv2d_input_grad(dy, sx, w, sw_in, tuple(x.shape), geom))


@pytest.mark.parametrize("geom", GEOMS)
@pytest.mark.parametrize("bits_g,bits_x", [(9, 9), (12, 8), (8, 12), (16, 15)])
def test_weight_gradient_equals_the_int64_reference(geom: ConvGeometry, bits_g: int, bits_x: int) -> None:
    g = torch.Generator().manual_seed(bits_g * 100 + bits_x)
    x = _codes(bits_x, (3, 8, 9, 7), g)
    w_shape = (6, 8 // geom.groups, 3, 3)
    dy = _codes(bits_g, (3, 6, *_out_hw(geom, (9, 7), 3)), g, top=32639 if bits_g == 16 else None)
    sg, sx = torch.rand(6, generator=g) + 0.1, torch.tensor([0.02])
    reset_kernel_calls()
    ours = conv_wide.conv2d_weight_grad(dy, sg, x, sx, w_shape, geom)
    assert torch.equal(ours.contiguous(), conv_reference.conv2d_weight_grad(dy, sg, x, sx, w_shape, geom))
    # dy's halves stacked along the output channels: one call per half of x (grouped: one per pair of halves)
    per_x = 1 if geom.groups == 1 else (2 if bits_g > 8 else 1)
    assert int_kernel_calls()["conv_wgrad"] == (2 if bits_x > 8 else 1) * per_x


def test_long_reductions_are_chunked_and_stay_exact() -> None:
    """160 channels x 9 taps = 1440 products of up to 2^14 each: past float32's exact integers in one call, so
    the reduction runs in chunks."""
    g = torch.Generator().manual_seed(7)
    geom = ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    x, w = _codes(9, (2, 160, 5, 5), g), _codes(9, (160, 160, 3, 3), g)
    x.fill_(-255)
    w.fill_(-255)  # every product at its largest: a float32 sum of one call would round
    sx, sw = torch.tensor([1.0]), torch.ones(160)
    reset_kernel_calls()
    y = conv_wide.conv2d_forward(x, sx, w, sw, geom)
    assert int_kernel_calls()["conv_fwd"] == 2 * 4  # two chunks, four pairs of halves
    assert torch.equal(y.contiguous(), conv_reference.conv2d_forward(x, sx, w, sw, geom))
    dx = conv_wide.conv2d_input_grad(x, sx, w, sw, tuple(x.shape), geom)
    assert torch.equal(dx.contiguous(), conv_reference.conv2d_input_grad(x, sx, w, sw, tuple(x.shape), geom))


def test_codes_past_the_split_range_fall_back_exactly() -> None:
    """16-bit codes above 32639 have no int8 rounded high half: the generic path serves them, still exact."""
    g = torch.Generator().manual_seed(3)
    geom = GEOMS[0]
    x, w = _codes(16, (2, 4, 6, 6), g), _codes(8, (4, 4, 3, 3), g)
    assert int(x.max()) == 32767
    sx, sw = torch.tensor([0.5]), torch.ones(4)
    reset_kernel_calls()
    y = conv_wide.conv2d_forward(x, sx, w, sw, geom)
    assert torch.equal(y.contiguous(), conv_reference.conv2d_forward(x, sx, w, sw, geom))
    assert "conv_fwd" not in int_kernel_calls()  # the generic path's GEMMs count as int8_mm


def test_without_the_native_library_the_torch_path_gives_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """No C compiler or no VNNI: oneDNN's int8 convolutions and float64 torch ops, still the reference's bits."""
    monkeypatch.setattr(native, "available", lambda: False)
    g = torch.Generator().manual_seed(11)
    geom = GEOMS[1]
    x, w = _codes(9, (2, 8, 9, 7), g), _codes(9, (6, 8, 3, 3), g)
    sx, sw = torch.tensor([0.03]), torch.rand(6, generator=g) + 0.1
    y = conv_wide.conv2d_forward(x, sx, w, sw, geom)
    assert torch.equal(y.contiguous(), conv_reference.conv2d_forward(x, sx, w, sw, geom))
    dy = _codes(9, tuple(y.shape), g)
    sw_in = torch.rand(8, generator=g) + 0.1
    dx = conv_wide.conv2d_input_grad(dy, sx, w, sw_in, tuple(x.shape), geom)
    assert torch.equal(dx.contiguous(), conv_reference.conv2d_input_grad(dy, sx, w, sw_in, tuple(x.shape), geom))


@pytest.mark.skipif(not native.available(), reason="needs the native library")
def test_native_combine_rejects_parts_it_cannot_read_as_pixel_rows() -> None:
    nchw = torch.zeros(2, 4, 3, 3)  # plain NCHW: a pixel's channels are not one row
    with pytest.raises(ValueError, match="channels-last"):
        native.wide_combine([(1, nchw)], 4, torch.ones(4), 1.0)
    stacked = torch.arange(2 * 8 * 3 * 3, dtype=torch.float32).reshape(2, 8, 3, 3).contiguous(
        memory_format=torch.channels_last)
    got = native.wide_combine([(256, stacked[:, :4]), (1, stacked[:, 4:])], 4, torch.full((4,), 0.5), 2.0)
    want = ((stacked[:, :4].double() * 256 + stacked[:, 4:].double()) * 1.0).float()
    assert torch.equal(got, want) and got.is_contiguous(memory_format=torch.channels_last)
