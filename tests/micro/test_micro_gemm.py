import numpy as np
import pytest

from inttrain.micro.gemm import F32_EXACT, exact_chunk, int_matmul, int_matmul_reference


def test_bound_constants():
    assert exact_chunk(127, 127) == 1040
    assert 1040 * 127 * 127 <= F32_EXACT < 1041 * 127 * 127


def test_edge_k1040_exact_in_one_float32_gemm():
    a = np.full((2, 1040), 127, dtype=np.int8)
    b = np.full((1040, 3), -127, dtype=np.int8)
    naive = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.int64)
    assert np.array_equal(naive, int_matmul_reference(a, b))        # inside the bound: exact
    assert np.array_equal(int_matmul(a, b), int_matmul_reference(a, b))


def test_k1041_breaks_one_float32_gemm_but_not_ours():
    a = np.full((2, 1041), 127, dtype=np.int8)
    b = np.full((1041, 3), 127, dtype=np.int8)
    ref = int_matmul_reference(a, b)
    assert int(ref[0, 0]) == 1041 * 16129 and ref[0, 0] % 2 == 1 and ref[0, 0] > 2**24
    naive = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.int64)
    assert not np.array_equal(naive, ref)          # an odd integer above 2**24 is not a float32
    assert np.array_equal(int_matmul(a, b), ref)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 300, 5), (16, 1040, 8), (9, 1041, 4), (5, 5000, 6), (3, 0, 2)])
def test_random_matches_int64_reference(m, k, n):
    rng = np.random.default_rng(k)
    a = rng.integers(-127, 128, size=(m, k)).astype(np.int8)
    b = rng.integers(-127, 128, size=(k, n)).astype(np.int8)
    a[:, : k // 2] = 127 if k else 0                   # push sums toward the bound
    b[: k // 2] = 127 if k else 0
    assert np.array_equal(int_matmul(a, b), int_matmul_reference(a, b))


def test_wide_operands_take_float64_path():
    rng = np.random.default_rng(1)
    a = rng.integers(-32767, 32768, size=(4, 3000)).astype(np.int16)
    b = rng.integers(-127, 128, size=(3000, 5)).astype(np.int8)
    assert np.array_equal(int_matmul(a, b), int_matmul_reference(a, b))


def test_non_contiguous_operands():
    rng = np.random.default_rng(2)
    a = rng.integers(-127, 128, size=(30, 2100)).astype(np.int8)
    b = rng.integers(-127, 128, size=(20, 2100)).astype(np.int8)
    assert np.array_equal(int_matmul(a, b.T), int_matmul_reference(a, b.T))


@pytest.mark.parametrize("k,products", [(1041, 2), (1088, 2), (2080, 2), (4000, 4), (8320, 8), (8321, 1)])
def test_matmul_exact_float32_chunks_are_exact_at_the_worst_case(k, products, monkeypatch):
    """K just past one float32 product's bound takes <= MAX_F32_CHUNKS (8) float32 products summed in float64
    (8320 = 8 chunks of 1040); 8321 falls back to one float64 product. All-127 operands give the odd sums above
    2**24 that a single float32 product gets wrong."""
    from inttrain.micro.gemm import matmul_exact

    calls, matmul = [], np.matmul
    monkeypatch.setattr(np, "matmul", lambda x, y: calls.append(x.dtype) or matmul(x, y))

    a = np.full((2, 3, k), 127, dtype=np.int8)              # a batch dimension, as the conv weight gradient's
    b = np.full((2, k, 4), 127, dtype=np.int8)
    b[1, ::3] = -127
    ref = np.stack([int_matmul_reference(a[i], b[i]) for i in range(2)])
    out = matmul_exact(a.astype(np.float32), b)
    assert out.dtype == np.float64 and np.array_equal(out.astype(np.int64), ref)
    assert calls == ([np.float32] * products if products > 1 else [np.float64])
