"""The AMX int8 GEMM: bit-exact against the int64 reference for every shape, stride and thread count, and the
path ``int8_mm`` takes on CPUs with AMX (these tests skip elsewhere, with the library's reason)."""

from __future__ import annotations

import pytest
import torch

from inttrain.kernels import int_kernel_calls, int_mm, int_mm_reference, native, reset_kernel_calls
from inttrain.kernels.fused import dequant_epilogue
from inttrain.kernels.matmul import int_mm_dequant

needs_amx = pytest.mark.skipif(not native.amx_available(), reason=f"AMX GEMM unavailable: {native.GEMM_LIBRARY.reason}")


def _codes(shape: tuple, gen: torch.Generator, layout: str) -> torch.Tensor:
    t = torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)
    if layout == "column-major":
        return t.t().contiguous().t()
    if layout == "strided":  # rows of a wider matrix, every other column
        wide = torch.randint(-128, 128, (shape[0], 2 * shape[1] + 3), dtype=torch.int8, generator=gen)
        return wide[:, 1 : 2 * shape[1] + 1 : 2]
    return t


# (m, k, n): 1x1x1, tails of every tile size (32 rows, 64-deep, 32 columns), tile-aligned shapes read in
# place, a short and a long reduction, and the MLP / weight-gradient shapes.
SHAPES = [(1, 1, 1), (5, 7, 3), (31, 63, 33), (32, 64, 32), (33, 65, 31), (64, 128, 96), (100, 300, 70),
          (10, 512, 1024), (1024, 512, 10), (17, 4096, 48), (256, 784, 128)]


@needs_amx
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("a_layout", ["row-major", "column-major", "strided"])
@pytest.mark.parametrize("b_layout", ["row-major", "column-major", "strided"])
def test_bit_exact_against_int64_reference(shape: tuple, a_layout: str, b_layout: str) -> None:
    m, k, n = shape
    gen = torch.Generator().manual_seed(m * 7919 + k * 31 + n)
    a, b = _codes((m, k), gen, a_layout), _codes((k, n), gen, b_layout)
    for threads in (1, 2, 3):
        got = native.int8_mm_amx(a, b, threads=threads)
        assert got.dtype == torch.int32 and got.shape == (m, n) and got.is_contiguous()
        assert torch.equal(got.long(), int_mm_reference(a, b)), threads


@needs_amx
def test_extreme_codes_at_the_longest_exact_reduction_do_not_overflow() -> None:
    k = (2**31 - 1) // 2**14  # every product 2^14: the sum is 2^31 - 2^14, the largest an int32 holds here
    a = torch.full((32, k), -128, dtype=torch.int8)
    b = torch.full((k, 32), -128, dtype=torch.int8)
    got = native.int8_mm_amx(a, b)
    assert torch.equal(got.long(), torch.full((32, 32), k * 2**14, dtype=torch.int64))


@needs_amx
def test_writes_into_out_and_handles_empty_operands() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = _codes((40, 70), gen, "row-major"), _codes((70, 50), gen, "row-major")
    out = torch.full((40, 50), 7, dtype=torch.int32)
    assert native.int8_mm_amx(a, b, out) is out
    assert torch.equal(out.long(), int_mm_reference(a, b))
    assert torch.equal(native.int8_mm_amx(a[:, :0], b[:0]), torch.zeros((40, 50), dtype=torch.int32))
    assert native.int8_mm_amx(a[:0], b).shape == (0, 50)


@needs_amx
def test_int8_mm_runs_on_it_and_counts_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = native.int8_mm_amx
    monkeypatch.setattr(native, "int8_mm_amx", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    gen = torch.Generator().manual_seed(1)
    a, b = _codes((48, 96), gen, "column-major"), _codes((96, 80), gen, "row-major")
    reset_kernel_calls()
    got = int_mm(a, b, reuse_output=True)
    assert calls and int_kernel_calls() == {"int8_mm": 1}
    assert torch.equal(got.long(), int_mm_reference(a, b))


@needs_amx
@pytest.mark.parametrize("shape", [(1, 1, 1), (5, 7, 3), (33, 65, 31), (64, 128, 96), (1024, 512, 10)])
@pytest.mark.parametrize("scales", ["row x column", "one x column", "row x one", "one x one"])
def test_dequantizing_gemm_equals_the_int32_product_times_its_scales(shape: tuple, scales: str) -> None:
    m, k, n = shape
    gen = torch.Generator().manual_seed(m + 3 * k + 7 * n)
    a, b = _codes((k, m), gen, "row-major").t(), _codes((k, n), gen, "strided")  # a weight gradient's dy^T
    sa = torch.rand((m, 1) if scales.startswith("row") else (1, 1), generator=gen) / 100
    sb = torch.rand((1, n) if scales.endswith("column") else (1, 1), generator=gen) / 100
    want = native.int8_mm_amx(a, b).float() * sa * sb  # the order torch evaluates acc.float() * sa * sb in
    for threads in (1, 2, 3):
        got = native.int8_mm_amx_scaled(a, b, sa, sb, threads=threads)
        assert got.dtype == torch.float32 and got.shape == (m, n) and got.is_contiguous()
        assert torch.equal(got, want), threads
    with pytest.raises(ValueError, match="scales must have 1 or"):
        native.int8_mm_amx_scaled(a, b, torch.ones(m + 1, 1), sb)


@needs_amx
def test_int_mm_dequant_is_the_epilogue_of_int_mm_fused_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(5)
    a, b = _codes((96, 40), gen, "column-major"), _codes((96, 72), gen, "row-major")
    sa, sb = torch.rand(40, 1, generator=gen), torch.rand(1, 1, generator=gen)
    want = dequant_epilogue(int_mm(a.t(), b), sa, sb)
    calls = []
    real = native.int8_mm_amx_scaled
    monkeypatch.setattr(native, "int8_mm_amx_scaled", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    reset_kernel_calls()
    assert torch.equal(int_mm_dequant(a.t(), b, sa, sb), want)
    assert calls and int_kernel_calls() == {"int8_mm": 1}
    # scales the kernel does not take (here a bfloat16 one) go the unfused way: the epilogue's result, no call
    sb16 = sb.bfloat16()
    assert torch.equal(int_mm_dequant(a.t(), b, sa, sb16), dequant_epilogue(int_mm(a.t(), b), sa, sb16))
    assert len(calls) == 1
    got = torch.ops.inttrain.int8_mm_dequant(a.t(), b, sa, sb)
    assert torch.equal(got, want)
    torch.library.opcheck(torch.ops.inttrain.int8_mm_dequant, (a.t(), b, sa, sb))


def test_rejects_what_it_cannot_multiply() -> None:
    if not native.amx_available():
        pytest.skip(f"AMX GEMM unavailable: {native.GEMM_LIBRARY.reason}")
    a8 = torch.zeros((4, 5), dtype=torch.int8)
    with pytest.raises(TypeError, match="expected int8 CPU matrices"):
        native.int8_mm_amx(a8.to(torch.int16), torch.zeros((5, 3), dtype=torch.int8))
    with pytest.raises(ValueError, match=r"cannot multiply \(4, 5\) by \(6, 3\) exactly in int32"):
        native.int8_mm_amx(a8, torch.zeros((6, 3), dtype=torch.int8))
    with pytest.raises(ValueError, match="out must be a row-major int32"):
        native.int8_mm_amx(a8, torch.zeros((5, 3), dtype=torch.int8), torch.zeros((4, 3), dtype=torch.int64))


def test_unavailable_without_amx_is_a_reason_not_an_error() -> None:
    lib = native.GEMM_LIBRARY
    assert (lib.load() is None) == (lib.reason is not None)
    if lib.load() is None:
        assert "AMX" in lib.reason or "compiler" in lib.reason or "failed" in lib.reason
