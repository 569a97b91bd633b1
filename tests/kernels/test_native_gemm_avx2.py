"""The AVX2 int8 GEMM: bit-exact against the int64 reference for every shape, stride and thread count, exact at
the int32 bound (these tests skip on CPUs without AVX2, with the library's reason)."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inttrain.kernels import native
from inttrain.kernels.matmul import INT8_SAFE_K, int_mm_reference

pytestmark = pytest.mark.skipif(not native.avx2_gemm_available(),
                                reason=f"AVX2 GEMM unavailable: {native.GEMM_AVX2_LIBRARY.reason}")

LAYOUTS = ["row-major", "transposed", "strided", "row-step", "broadcast"]


def _codes(shape: tuple[int, int], gen: torch.Generator, layout: str = "row-major") -> torch.Tensor:
    """int8 codes of `shape` laid out as `layout`: the values depend only on the generator, not the layout."""
    rows, cols = shape
    if layout == "broadcast":  # one row repeated: stride 0 along the rows
        return torch.randint(-128, 128, (1, cols), dtype=torch.int8, generator=gen).expand(rows, cols)
    t = torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)
    if layout == "transposed":  # column-major: a transposed row-major matrix (a weight, or dy^T)
        return t.t().contiguous().t()
    if layout == "strided":  # every other column of a wider matrix, from an offset
        wide = torch.zeros((rows, 2 * cols + 3), dtype=torch.int8)
        wide[:, 1 : 2 * cols + 1 : 2] = t
        return wide[:, 1 : 2 * cols + 1 : 2]
    if layout == "row-step":  # every third row of a taller matrix
        tall = torch.zeros((3 * rows, cols), dtype=torch.int8)
        tall[::3] = t
        return tall[::3]
    return t


def _check(a: torch.Tensor, b: torch.Tensor, threads: tuple[int, ...] = (1, 2)) -> None:
    want = int_mm_reference(a, b)
    for t in threads:
        got = native.int8_mm_avx2(a, b, threads=t)
        assert got.dtype == torch.int32 and got.shape == want.shape and got.is_contiguous()
        assert torch.equal(got.long(), want), (tuple(a.shape), tuple(b.shape), a.stride(), b.stride(), t)


# Edges of the 6-row micro-kernel, the 16-column panels and the k pairs (odd K), primes, 1.
EDGE_SIZES = [1, 2, 5, 6, 7, 13, 16, 17, 31, 37, 48, 70]


@pytest.mark.parametrize("k", [1, 2, 3, 15, 16, 17, 41, 67, 70])
def test_every_small_shape_is_exact(k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    for m in EDGE_SIZES:
        for n in EDGE_SIZES:
            _check(_codes((m, k), gen), _codes((k, n), gen))
            _check(_codes((m, k), gen, "transposed"), _codes((k, n), gen, "transposed"))  # the transposing packers


# (m, k, n): a prime tail on every side, and the blocking's edges: several K blocks (384 deep), A blocks (96 rows)
# and B blocks (1024 columns); long and short reductions.
LARGER = [(257, 1031, 65), (257, 65, 1031), (101, 777, 1043), (193, 2000, 35), (7, 5000, 130), (1000, 3, 33)]


@pytest.mark.parametrize("shape", LARGER)
def test_larger_shapes_are_exact(shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    gen = torch.Generator().manual_seed(m + 7 * k + 31 * n)
    _check(_codes((m, k), gen), _codes((k, n), gen), threads=(1, 2, 3))


@pytest.mark.parametrize("a_layout", LAYOUTS)
@pytest.mark.parametrize("b_layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(5, 7, 3), (37, 70, 41), (96, 33, 48), (23, 40, 17)])
def test_any_strides_on_either_side(a_layout: str, b_layout: str, shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    gen = torch.Generator().manual_seed(m * 7919 + k * 31 + n)
    a, b = _codes((m, k), gen, a_layout), _codes((k, n), gen, b_layout)
    _check(a, b)
    _check(a[1:, 2:], b[2:, 1:])  # sliced: offset data pointers


@pytest.mark.parametrize("value_a, value_b", [(-128, -128), (127, 127), (-128, 127)])
def test_extreme_codes_sum_exactly(value_a: int, value_b: int) -> None:
    m, k, n = 37, 1000, 45
    a = torch.full((m, k), value_a, dtype=torch.int8)
    b = torch.full((k, n), value_b, dtype=torch.int8)
    for t in (1, 2):
        got = native.int8_mm_avx2(a, b, threads=t)
        assert torch.equal(got.long(), torch.full((m, n), k * value_a * value_b, dtype=torch.int64))
    gen = torch.Generator().manual_seed(3)  # random signs of the extreme codes: every product is +-2^14 or so
    signs_a = torch.randint(0, 2, (m, k), generator=gen).bool()
    signs_b = torch.randint(0, 2, (k, n), generator=gen).bool()
    a = torch.where(signs_a, torch.tensor(-128, dtype=torch.int8), torch.tensor(127, dtype=torch.int8))
    b = torch.where(signs_b, torch.tensor(-128, dtype=torch.int8), torch.tensor(127, dtype=torch.int8))
    _check(a, b)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_longest_exact_reduction_reaches_the_int32_bound(threads: int) -> None:
    k = INT8_SAFE_K  # 131071: every product 2^14 sums to 2^31 - 2^14, the largest an int32 holds here
    assert k == (2**31 - 1) // 2**14
    a = torch.full((8, k), -128, dtype=torch.int8)
    b = torch.full((k, 20), -128, dtype=torch.int8)
    b[:, 10:] = 127  # the other sign: -128 * 127 * k
    want = torch.cat([torch.full((8, 10), 2**14 * k), torch.full((8, 10), -128 * 127 * k)], dim=1)
    assert want.max() == 2**31 - 2**14
    got = native.int8_mm_avx2(a, b, threads=threads)  # a small product: the threads cut K, then add the parts
    assert torch.equal(got.long(), want)
    got_t = native.int8_mm_avx2(a.t().contiguous().t(), b.t().contiguous().t(), threads=threads)
    assert torch.equal(got_t.long(), want)


def test_writes_into_out_even_inside_a_wider_matrix() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = _codes((40, 70), gen), _codes((70, 50), gen)
    want = int_mm_reference(a, b)
    out = torch.full((40, 50), 7, dtype=torch.int32)
    assert native.int8_mm_avx2(a, b, out) is out
    assert torch.equal(out.long(), want)
    wide = torch.full((40, 64), -1, dtype=torch.int32)  # row-major rows of 64: ldc != n
    for t in (1, 2):
        got = native.int8_mm_avx2(a, b, wide[:, 5:55], threads=t)
        assert torch.equal(got.long(), want) and torch.equal(wide[:, :5], torch.full((40, 5), -1, dtype=torch.int32))
        assert torch.equal(wide[:, 55:], torch.full((40, 9), -1, dtype=torch.int32))
    # a long reduction cut across the threads, summed into a strided out
    a, b = _codes((6, 40000), gen), _codes((40000, 9), gen)
    wide = torch.zeros((6, 20), dtype=torch.int32)
    native.int8_mm_avx2(a, b, wide[:, 3:12], threads=2)
    assert torch.equal(wide[:, 3:12].long(), int_mm_reference(a, b))


def test_thread_counts_give_the_same_bits() -> None:
    gen = torch.Generator().manual_seed(11)
    for m, k, n in [(300, 200, 70), (16, 20000, 144), (2000, 144, 16)]:
        a, b = _codes((m, k), gen), _codes((k, n), gen)
        one = native.int8_mm_avx2(a, b, threads=1)
        assert torch.equal(native.int8_mm_avx2(a, b, threads=2), one)
        assert torch.equal(native.int8_mm_avx2(a, b), one)  # torch's thread count
    assert torch.equal(one.long(), int_mm_reference(a, b))


def test_empty_operands() -> None:
    a, b = torch.ones((4, 0), dtype=torch.int8), torch.ones((0, 3), dtype=torch.int8)
    assert torch.equal(native.int8_mm_avx2(a, b, torch.full((4, 3), 5, dtype=torch.int32)),
                       torch.zeros((4, 3), dtype=torch.int32))
    assert native.int8_mm_avx2(torch.ones((0, 5), dtype=torch.int8), torch.ones((5, 3), dtype=torch.int8)).shape == (0, 3)
    assert native.int8_mm_avx2(torch.ones((2, 5), dtype=torch.int8), torch.ones((5, 0), dtype=torch.int8)).shape == (2, 0)


def test_rejects_what_it_cannot_multiply() -> None:
    a8, b8 = torch.zeros((4, 5), dtype=torch.int8), torch.zeros((5, 3), dtype=torch.int8)
    with pytest.raises(TypeError, match=re.escape("expected int8 CPU matrices, got torch.int16 on cpu and torch.int8 on cpu")):
        native.int8_mm_avx2(a8.to(torch.int16), b8)
    with pytest.raises(TypeError, match=re.escape("expected int8 CPU matrices, got torch.int8 on cpu and torch.uint8 on cpu")):
        native.int8_mm_avx2(a8, b8.to(torch.uint8))
    with pytest.raises(ValueError, match=re.escape("cannot multiply (4, 5) by (6, 3) exactly in int32")):
        native.int8_mm_avx2(a8, torch.zeros((6, 3), dtype=torch.int8))
    k = INT8_SAFE_K + 1  # one longer than int32 sums hold: the caller splits K
    with pytest.raises(ValueError, match=re.escape(f"cannot multiply (2, {k}) by ({k}, 3) exactly in int32")):
        native.int8_mm_avx2(torch.zeros((2, k), dtype=torch.int8), torch.zeros((k, 3), dtype=torch.int8))
    with pytest.raises(ValueError, match=re.escape("out must be a row-major int32 [4, 3], got (4, 3) torch.int64")):
        native.int8_mm_avx2(a8, b8, torch.zeros((4, 3), dtype=torch.int64))
    with pytest.raises(ValueError, match=re.escape("out must be a row-major int32 [4, 3], got (4, 3) torch.int32")):
        native.int8_mm_avx2(a8, b8, torch.zeros((3, 4), dtype=torch.int32).t())


def test_available_means_a_loaded_library() -> None:
    lib = native.GEMM_AVX2_LIBRARY
    assert lib.load() is not None and lib.reason is None
    assert "gemm_avx2" in str(lib.build())


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 70), k=st.integers(1, 70), n=st.integers(1, 70), a_layout=st.sampled_from(LAYOUTS),
       b_layout=st.sampled_from(LAYOUTS), threads=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
def test_random_shapes_and_strides_are_exact(m: int, k: int, n: int, a_layout: str, b_layout: str, threads: int,
                                             seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    a, b = _codes((m, k), gen, a_layout), _codes((k, n), gen, b_layout)
    assert torch.equal(native.int8_mm_avx2(a, b, threads=threads).long(), int_mm_reference(a, b))
