"""Exact integer GEMM on float BLAS.

NumPy's integer matmul does not use BLAS and is slow, so int8 x int8 products are computed with
float32 BLAS on K-chunks small enough to be exact, and the chunks are summed in int64.

Exactness bound (float32). Let A = max|a|, B = max|b| over the operands and split K into chunks of
length k with k * A * B <= 2**24. Whatever order (or FMA) the BLAS uses, every intermediate value
it forms for one output element is a sum of a subset of the k products a_i * b_i, hence an integer
of magnitude <= k * A * B <= 2**24. Every integer of magnitude <= 2**24 is representable in float32
(24-bit significand), and IEEE addition / FMA returns the exact result whenever that result is
representable. By induction every partial sum is exact, so the chunk result is the exact integer.
For int8 codes saturated to [-127, 127]: A * B <= 16129 and 2**24 / 16129 = 1040.2, so K <= 1040
is always exact in one chunk (1040 * 16129 = 16774160 <= 16777216), while at K = 1041 the all-127
sum 16790289 is odd and above 2**24, hence not representable: one float32 GEMM must be wrong there.
The chunk is computed from the actual maxima, so small codes get longer chunks. When a chunk would
be shorter than ``MIN_F32_CHUNK`` (wide operands, e.g. int16) the same argument is used with float64
(2**53). Chunk sums are accumulated in int64 (exact for any realistic K).
"""

from __future__ import annotations

import numpy as np

F32_EXACT = 1 << 24
F64_EXACT = 1 << 53
MIN_F32_CHUNK = 64
#: matmul_exact splits K into at most this many float32 chunks before it falls back to one float64 product.
MAX_F32_CHUNKS = 8


def _absmax(a: np.ndarray) -> int:
    return max(int(a.max()), -int(a.min())) if a.size else 0   # no widening copy of the operand


def exact_chunk(amax: int, bmax: int, limit: int = F32_EXACT) -> int:
    """Longest K for which a float GEMM with these operand maxima is exact (>= 1, 'inf' as 2**62)."""
    p = int(amax) * int(bmax)
    return (1 << 62) if p == 0 else max(1, limit // p)


def int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact a @ b for integer arrays a (M, K), b (K, N); int64 result."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"int_matmul shapes {a.shape} @ {b.shape}")
    m, k = a.shape
    n = b.shape[1]
    if k == 0 or m == 0 or n == 0:
        return np.zeros((m, n), dtype=np.int64)
    amax, bmax = _absmax(a), _absmax(b)
    chunk = exact_chunk(amax, bmax, F32_EXACT)
    if chunk >= MIN_F32_CHUNK or chunk >= k:
        ftype = np.float32
    else:
        ftype = np.float64
        chunk = exact_chunk(amax, bmax, F64_EXACT)
    if chunk >= k:
        return (a.astype(ftype) @ b.astype(ftype)).astype(np.int64)
    out = np.zeros((m, n), dtype=np.int64)
    for start in range(0, k, chunk):
        stop = min(k, start + chunk)
        out += (a[:, start:stop].astype(ftype) @ b[start:stop].astype(ftype)).astype(np.int64)
    return out


def exact_float_dtype(k: int, amax: int, bmax: int):
    """float32 if a length-``k`` reduction of these operand maxima is exact in float32 (every partial sum
    <= 2**24), float64 if it is exact there (<= 2**53), else None."""
    p = int(k) * int(amax) * int(bmax)
    return np.float32 if p <= F32_EXACT else (np.float64 if p <= F64_EXACT else None)


def matmul_exact(a: np.ndarray, b: np.ndarray, amax: int | None = None, bmax: int | None = None) -> np.ndarray:
    """Exact ``np.matmul(a, b)`` of integer-valued operands (batch dimensions broadcast, as np.matmul).

    Returns a float32 or float64 array whose values are the exact integer results: one float32 BLAS
    product when ``K * max|a| * max|b| <= 2**24`` (the §3 argument with the whole K as one chunk); else, when
    K splits into at most ``MAX_F32_CHUNKS`` chunks that each meet that bound, one float32 product per chunk
    summed in float64 (each chunk's result is an exact integer of magnitude <= 2**24, so their float64 sum is
    exact; ResNet-20's first-stage weight gradients, K = 32 x 34 = 1088 against int8's 1040, ran 4x faster so
    than as one float64 product); else one float64 product when that bound is <= 2**53 (always, for int8 codes
    and the validated K <= 133144);
    beyond that (wide integer operands) the K-chunked int64 sum of ``int_matmul`` (2-D only). ``amax`` /
    ``bmax`` may be given when known (they only need to be upper bounds).
    """
    k = a.shape[-1]
    if amax is None:
        amax = _absmax(a)
    if bmax is None:
        bmax = _absmax(b)
    ft = exact_float_dtype(k, amax, bmax)
    if ft is not np.float32 and k > 0:
        chunk = exact_chunk(amax, bmax, F32_EXACT)
        if chunk >= MIN_F32_CHUNK and -(-k // chunk) <= MAX_F32_CHUNKS:
            a32, b32 = a.astype(np.float32, copy=False), b.astype(np.float32, copy=False)
            out = np.matmul(a32[..., :chunk], b32[..., :chunk, :]).astype(np.float64)
            for start in range(chunk, k, chunk):
                out += np.matmul(a32[..., start:start + chunk], b32[..., start:start + chunk, :])
            return out
    if ft is None:
        return int_matmul(a, b)
    return np.matmul(a.astype(ft, copy=False), b.astype(ft, copy=False))


def int_matmul_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pure int64 reference (slow): what ``int_matmul`` must equal bit for bit."""
    return a.astype(np.int64) @ b.astype(np.int64)
