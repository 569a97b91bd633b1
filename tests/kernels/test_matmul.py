"""Every fast GEMM path equals the exact int64 reference bit for bit."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inttrain.kernels import INT8_SAFE_K, int8_mm, int_kernel_calls, int_mm, int_mm_reference, reset_kernel_calls
from inttrain.kernels.matmul import split_int16

SIZES = [1, 7, 16, 17, 33, 64]
I8, I16 = (-128, 128), (-32768, 32768)


def _rand(shape, lim, dtype, gen):
    return torch.randint(*lim, shape, dtype=dtype, generator=gen)


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("k", SIZES)
@pytest.mark.parametrize("n", [1, 7, 17, 33])
def test_int8_mm_exact_odd_shapes(m, k, n):
    g = torch.Generator().manual_seed(m * 1000 + k * 10 + n)
    a, b = _rand((m, k), I8, torch.int8, g), _rand((k, n), I8, torch.int8, g)
    out = int_mm(a, b)
    assert out.dtype == torch.int32
    assert torch.equal(out.long(), int_mm_reference(a, b))


@pytest.mark.parametrize("layout", ["a_t", "b_t", "both_t", "a_slice", "b_step"])
def test_int8_mm_exact_non_contiguous(layout):
    g = torch.Generator().manual_seed(1)
    a, b = _rand((40, 70), I8, torch.int8, g), _rand((70, 50), I8, torch.int8, g)
    if layout in ("a_t", "both_t"):
        a = a.t().contiguous().t()
    if layout in ("b_t", "both_t"):
        b = b.t().contiguous().t()
    if layout == "a_slice":
        a = _rand((40, 140), I8, torch.int8, g)[:, ::2]
    if layout == "b_step":
        b = _rand((140, 50), I8, torch.int8, g)[1::2]
    assert not (a.is_contiguous() and b.is_contiguous())
    assert torch.equal(int_mm(a, b).long(), int_mm_reference(a, b))


def test_k_beyond_float32_exactness():
    # float32 holds int8 dot products exactly only up to K ~ 1040 at |q| = 127; int32 must not care.
    a = torch.full((3, 5000), 127, dtype=torch.int8)
    b = torch.full((5000, 2), 127, dtype=torch.int8)
    b[0, 0] = 126
    out = int_mm(a, b)
    ref = int_mm_reference(a, b)
    assert torch.equal(out.long(), ref)
    assert float(ref[0, 0]) != float(torch.tensor(ref[0, 0].item(), dtype=torch.float32))  # float32 would be wrong


def test_k_beyond_int32_is_split_and_exact():
    k = INT8_SAFE_K + 5000
    a = torch.full((2, k), -128, dtype=torch.int8)
    b = torch.full((k, 3), -128, dtype=torch.int8)
    out = int_mm(a, b)
    assert out.dtype == torch.int64
    assert int(out[0, 0]) == k * 128 * 128 > 2**31


@pytest.mark.parametrize("da,db", [(torch.int16, torch.int8), (torch.int8, torch.int16), (torch.int16, torch.int16)])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (17, 33, 7), (64, 300, 16)])
def test_int16_paths_exact(da, db, m, k, n):
    g = torch.Generator().manual_seed(m + k + n)
    a = _rand((m, k), I16 if da == torch.int16 else I8, da, g)
    b = _rand((k, n), I16 if db == torch.int16 else I8, db, g)
    a[0, 0] = -32768 if da == torch.int16 else -128  # range extremes
    b[-1, -1] = 32767 if db == torch.int16 else 127
    assert torch.equal(int_mm(a, b).long(), int_mm_reference(a, b))


def test_split_int16_roundtrip_full_range():
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    hi, lo = split_int16(x)
    assert hi.dtype == lo.dtype == torch.int8
    assert torch.equal(256 * hi.int() + lo.int() + 128, x.int())


def test_empty_dimensions():
    for m, k, n in [(0, 4, 3), (4, 0, 3), (4, 3, 0)]:
        out = int_mm(torch.zeros(m, k, dtype=torch.int8), torch.zeros(k, n, dtype=torch.int8))
        assert out.shape == (m, n) and not out.any()


def test_bad_operands_give_clear_errors():
    with pytest.raises(ValueError, match="shape mismatch"):
        int_mm(torch.zeros(2, 3, dtype=torch.int8), torch.zeros(4, 2, dtype=torch.int8))
    with pytest.raises(TypeError, match="int8 or int16"):
        int_mm(torch.zeros(2, 3), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="2-D"):
        int_mm(torch.zeros(2, 3, 1, dtype=torch.int8), torch.zeros(3, 2, dtype=torch.int8))


def test_kernel_counter_counts_real_launches():
    reset_kernel_calls()
    int8_mm(torch.ones(2, 2, dtype=torch.int8), torch.ones(2, 2, dtype=torch.int8))
    assert int_kernel_calls()["int8_mm"] == 1


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 80), n=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_int8_mm_property(m, k, n, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = _rand((m, k), I8, torch.int8, g), _rand((k, n), I8, torch.int8, g)
    assert torch.equal(int_mm(a, b).long(), int_mm_reference(a, b))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.cuda
def test_cuda_padding_path_exact():
    g = torch.Generator().manual_seed(0)
    a, b = _rand((5, 13), I8, torch.int8, g), _rand((13, 3), I8, torch.int8, g)
    assert torch.equal(int_mm(a.cuda(), b.cuda()).cpu().long(), int_mm_reference(a, b))


def test_reused_output_buffer_is_exact_and_reused():
    g = torch.Generator().manual_seed(5)
    a, b = _rand((9, 20), I8, torch.int8, g), _rand((20, 11), I8, torch.int8, g)
    first = int_mm(a, b, reuse_output=True)
    assert torch.equal(first.long(), int_mm_reference(a, b))
    a2, b2 = _rand((9, 20), I8, torch.int8, g), _rand((20, 11), I8, torch.int8, g)
    second = int_mm(a2, b2, reuse_output=True)
    assert torch.equal(second.long(), int_mm_reference(a2, b2))
    assert second.data_ptr() == first.data_ptr()  # same scratch buffer for the same shape


@pytest.mark.parametrize("m,k,n", [(1, 1, 2), (7, 1, 5), (2, 1, 1), (1, 3, 1), (17, 16, 1), (1, 33, 5)])
@pytest.mark.parametrize("a_t,b_t", [(False, True), (True, False), (True, True)])
def test_size_one_dimensions_with_transposed_operands(m, k, n, a_t, b_t):
    # torch._int_mm misreads strides like (1, 1) on size-1 dims and silently returns wrong numbers;
    # gemm_layout must hand it a layout it reads correctly.
    g = torch.Generator().manual_seed(m * 100 + k * 10 + n)
    a = _rand((k, m), I8, torch.int8, g).t() if a_t else _rand((m, k), I8, torch.int8, g)
    b = _rand((n, k), I8, torch.int8, g).t() if b_t else _rand((k, n), I8, torch.int8, g)
    assert torch.equal(int_mm(a, b).long(), int_mm_reference(a, b))


def test_cpu_without_int8_dot_products_takes_the_avx2_kernel_and_chunks_long_k(monkeypatch):
    """Where the AVX2 GEMM is the CPU's int8 GEMM every CPU int8 product goes through it (torch._int_mm runs a
    reference loop there), and a K past the kernel's int32 bound is cut into chunks whose int32 sums add up to
    torch._int_mm's result."""
    from inttrain.kernels import matmul, native

    calls = []

    def spy(a, b, out=None, threads=None):  # stands in for the native kernel on any CPU: records, multiplies
        calls.append(a.shape[1])
        product = torch._int_mm(matmul.gemm_layout(a), matmul.gemm_layout(b))
        return product if out is None else out.copy_(product)

    monkeypatch.setattr(native, "amx_available", lambda: False)
    monkeypatch.setattr(native, "avx2_gemm_preferred", lambda: True)
    monkeypatch.setattr(native, "int8_mm_avx2", spy)
    a, b = torch.randint(-128, 128, (9, 40), dtype=torch.int8), torch.randint(-128, 128, (40, 7), dtype=torch.int8)
    assert torch.equal(int8_mm(a, b).long(), int_mm_reference(a, b)) and calls == [40]
    calls.clear()
    k = INT8_SAFE_K + 100
    a, b = torch.ones((2, k), dtype=torch.int8), torch.ones((k, 3), dtype=torch.int8)
    assert torch.equal(matmul.int8_gemm_kernel(a, b), torch.full((2, 3), k, dtype=torch.int32))
    assert calls == [INT8_SAFE_K, 100]
