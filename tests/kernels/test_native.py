"""The native VNNI weight-gradient kernel: bit-exact against the int64 reference on every geometry it takes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inttrain.kernels import conv as K
from inttrain.kernels import native
from inttrain.kernels.conv_geometry import ConvGeometry

needs_native = pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.LIBRARY.reason}")


def _reference(gq: torch.Tensor, xq: torch.Tensor, shape: tuple, stride: int, pad: int, dil: int) -> torch.Tensor:
    # float64 holds these sums exactly (|sum| < 2^53)
    return torch.nn.grad.conv2d_weight(xq.double(), shape, gq.double(), stride=stride, padding=pad, dilation=dil).long()


def _codes(shape: tuple, channels_last: bool, gen: torch.Generator) -> torch.Tensor:
    t = torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)
    return t.contiguous(memory_format=torch.channels_last) if channels_last else t


# (n, ci, co, hw, k, stride, pad, dilation): whole and partial 16-channel tiles and 4-pixel groups,
# 16-pixel transpose blocks with a short tail, strides 1-3, dilation, 1x1 and 5x5 kernels.
GEOMETRIES = [
    (3, 5, 7, 9, 3, 1, 1, 1),
    (2, 3, 16, 11, 3, 2, 1, 1),
    (4, 16, 32, 10, 3, 2, 1, 1),
    (2, 8, 20, 7, 1, 2, 0, 1),
    (2, 4, 17, 9, 3, 1, 2, 2),
    (1, 3, 5, 6, 5, 3, 2, 1),
    (3, 16, 16, 20, 3, 1, 1, 1),
    (2, 32, 16, 35, 3, 2, 1, 1),
    (2, 16, 32, 33, 3, 3, 2, 1),
    (2, 64, 48, 8, 3, 1, 1, 1),
]


@needs_native
@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shifted", [False, True])
def test_bit_exact_against_int64_reference(geometry: tuple, channels_last: bool, shifted: bool) -> None:
    n, ci, co, hw, k, s, p, d = geometry
    gen = torch.Generator().manual_seed(hash(geometry) % 2**31)
    xq = _codes((n, ci, hw, hw), channels_last, gen)
    ho = (hw + 2 * p - d * (k - 1) - 1) // s + 1
    gq = _codes((n, co, ho, ho), channels_last, gen)
    x_in = K.to_shifted_u8(xq) if shifted else xq
    got = native.conv2d_weight_grad_int(gq, x_in, (co, ci, k, k), (s, s), (p, p), (d, d))
    assert got.dtype == torch.int64
    assert torch.equal(got, _reference(gq, xq, (co, ci, k, k), s, p, d))


@needs_native
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_int32_partials_flushed_before_overflow(threads: int) -> None:
    # 71680 products of g = -128 and x = 127, which the kernel reads as uint8 255: one int32 lane
    # would reach 71680 * -32640 < -2^31 without the flush to int64 between image chunks.
    gq = torch.full((70, 1, 32, 32), -128, dtype=torch.int8)
    xq = torch.full((70, 1, 32, 32), 127, dtype=torch.int8)
    got = native.conv2d_weight_grad_int(gq, xq, (1, 1, 1, 1), (1, 1), (0, 0), (1, 1), threads=threads)
    assert int(got) == 70 * 32 * 32 * -128 * 127


@needs_native
def test_conv_weight_grad_takes_the_native_path_and_matches_the_library_gemms(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    xq, gq = _codes((4, 16, 12, 12), True, gen), _codes((4, 32, 6, 6), True, gen)
    geom = ConvGeometry((2, 2), (1, 1), (1, 1), 1)
    calls: list[int] = []
    real = native.conv2d_weight_grad_int
    monkeypatch.setattr(native, "conv2d_weight_grad_int", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    fast = K.weight_grad_int(gq, K.to_shifted_u8(xq), (32, 16, 3, 3), geom)
    assert calls == [1]
    monkeypatch.setattr(native, "available", lambda: False)
    slow = K.weight_grad_int(gq, K.to_shifted_u8(xq), (32, 16, 3, 3), geom)
    assert calls == [1] and torch.equal(fast, slow)


def test_missing_compiler_leaves_the_torch_path_with_a_reason(tmp_path: Path) -> None:
    lib = native.NativeLibrary(native.LIBRARY.source, compiler=str(tmp_path / "no-such-cc"))
    assert lib.load() is None
    assert lib.reason is not None and "no C compiler" in lib.reason
    assert lib.load() is None  # tried once, remembered


def test_build_failure_is_reported_not_raised(tmp_path: Path) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    lib = native.NativeLibrary(broken)
    assert lib.load() is None
    assert lib.reason is not None and "failed" in lib.reason


def test_rejects_wrong_dtypes() -> None:
    if not native.available():
        pytest.skip("native kernels unavailable")
    g = torch.zeros((1, 1, 2, 2), dtype=torch.int16)
    x = torch.zeros((1, 1, 2, 2), dtype=torch.uint8)
    with pytest.raises(TypeError, match="expected a CPU int8 gradient"):
        native.conv2d_weight_grad_int(g, x, (1, 1, 1, 1), (1, 1), (0, 0), (1, 1))
