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
    x.view(-1)[-1] = w.view(-1)[-1] = -254  # not all odd: the int8 halves (affine codes: their own test below)
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


# ------------------------------------------------------------------ affine codes (DoReFa's): one int8 call each

def _unsigned(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Codes 0..255 (DoReFa's activations), both ends present."""
    q = torch.randint(0, 256, shape, generator=g)
    q.view(-1)[0], q.view(-1)[-1] = 0, 255
    return q.to(torch.int16)


def _odd(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Odd codes within +-255 (DoReFa's weights and gradients), both ends present."""
    q = 2 * torch.randint(0, 256, shape, generator=g) - 255
    q.view(-1)[0], q.view(-1)[-1] = -255, 255
    return q.to(torch.int16)


def _int8(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return _codes(8, shape, g)


def test_affine_codes_recognise_unsigned_and_odd_codes_only() -> None:
    g = torch.Generator().manual_seed(5)
    unsigned, odd = conv_wide.affine_codes(_unsigned((4, 9), g)), conv_wide.affine_codes(_odd((4, 9), g))
    assert (unsigned.mul, unsigned.add) == (1, 128) and (odd.mul, odd.add) == (2, 1)
    for codes in (unsigned, odd):  # q = mul * j + add, j int8, and j + 128 as uint8
        j = codes.j()
        assert j.dtype == torch.int8 and torch.equal(codes.mul * j.to(torch.int16) + codes.add, codes.q)
        assert torch.equal(codes.shifted().to(torch.int16) - 128, j.to(torch.int16))
    assert conv_wide.affine_codes(_int8((3, 3), g)).mul == 1
    rejected = [torch.tensor([0, 256]), torch.tensor([-1, 2, 5]), torch.tensor([-255, 257]), torch.tensor([-2, 4]),
                torch.tensor([-3, 0, 3]), torch.zeros(0)]
    for q in rejected:
        assert conv_wide.affine_codes(q.to(torch.int16)) is None, q


PAIRS = [(_unsigned, _odd), (_odd, _odd), (_unsigned, _unsigned), (_int8, _odd), (_unsigned, _int8)]


@pytest.mark.parametrize("geom", GEOMS)
@pytest.mark.parametrize("make_a,make_b", PAIRS)
def test_affine_codes_give_the_reference_bits_with_one_kernel_call(geom: ConvGeometry, make_a, make_b) -> None:
    """Activation and output-gradient codes ``make_a``, weights ``make_b``: every convolution equals the int64
    reference bit for bit, on one int8 kernel call where ungrouped (grouped ones keep the int8 halves)."""
    g = torch.Generator().manual_seed(17)
    x, w = make_a((3, 8, 9, 7), g), make_b((6, 8 // geom.groups, 3, 3), g)
    dy = make_a((3, 6, *_out_hw(geom, (9, 7), 3)), g)
    sx, sw, sg = torch.tensor([0.01]), torch.rand(6, generator=g) + 0.1, torch.rand(6, generator=g) + 0.1
    sw_in = torch.rand(8, generator=g) + 0.1
    reset_kernel_calls()
    y = conv_wide.conv2d_forward(x, sx, w, sw, geom)
    dx = conv_wide.conv2d_input_grad(dy, sg[:1], w, sw_in, tuple(x.shape), geom)
    dw = conv_wide.conv2d_weight_grad(dy, sg, x, sx, tuple(w.shape), geom)
    assert torch.equal(y.contiguous(), conv_reference.conv2d_forward(x, sx, w, sw, geom))
    assert torch.equal(dx.contiguous(), conv_reference.conv2d_input_grad(dy, sg[:1], w, sw_in, tuple(x.shape), geom))
    assert torch.equal(dw.contiguous(), conv_reference.conv2d_weight_grad(dy, sg, x, sx, tuple(w.shape), geom))
    if geom.groups == 1:
        assert int_kernel_calls() == {"conv_fwd": 1, "conv_dgrad": 1, "conv_wgrad": 1}


def test_affine_codes_chunk_long_reductions_exactly() -> None:
    """160 input channels x 9 taps of the largest products: the one int8 call per chunk stays exact."""
    g = torch.Generator().manual_seed(8)
    geom = GEOMS[0]
    x, w = _unsigned((2, 160, 5, 5), g).fill_(255), _odd((160, 160, 3, 3), g).fill_(-255)
    sx, sw = torch.tensor([1.0]), torch.ones(160)
    reset_kernel_calls()
    y = conv_wide.conv2d_forward(x, sx, w, sw, geom)
    assert int_kernel_calls()["conv_fwd"] == 2
    assert torch.equal(y.contiguous(), conv_reference.conv2d_forward(x, sx, w, sw, geom))
    dy = _odd(tuple(y.shape), g).fill_(255)
    dx = conv_wide.conv2d_input_grad(dy, sx, w, sw, tuple(x.shape), geom)
    assert torch.equal(dx.contiguous(), conv_reference.conv2d_input_grad(dy, sx, w, sw, tuple(x.shape), geom))


def test_affine_codes_fused_passes_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the passes compiled (INTTRAIN_COMPILE=1, as outside the tests) the results are the reference's."""
    monkeypatch.setenv("INTTRAIN_COMPILE", "1")
    g = torch.Generator().manual_seed(21)
    geom = GEOMS[1]
    x, w = _unsigned((2, 8, 9, 7), g), _odd((6, 8, 3, 3), g)
    sx, sw = torch.tensor([0.03]), torch.rand(6, generator=g) + 0.1
    y = conv_wide.conv2d_forward(x, sx, w, sw, geom)
    assert torch.equal(y.contiguous(), conv_reference.conv2d_forward(x, sx, w, sw, geom))
    dy = _odd(tuple(y.shape), g)
    dx = conv_wide.conv2d_input_grad(dy, sx, w, sw[:1], tuple(x.shape), geom)
    assert torch.equal(dx.contiguous(), conv_reference.conv2d_input_grad(dy, sx, w, sw[:1], tuple(x.shape), geom))
    dw = conv_wide.conv2d_weight_grad(dy, sw, x, sx, tuple(w.shape), geom)
    assert torch.equal(dw.contiguous(), conv_reference.conv2d_weight_grad(dy, sw, x, sx, tuple(w.shape), geom))
