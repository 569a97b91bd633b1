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
