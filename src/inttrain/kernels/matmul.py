"""Integer GEMMs: an exact int64 reference and the fast ``torch._int_mm`` path, int8 and int16.

On CPUs with AMX the int8 GEMM runs on :func:`inttrain.kernels.native.int8_mm_amx` (AMX tiles, exact
int32 sums like ``torch._int_mm``, whose oneDNN GEMM uses the AVX512-VNNI units only: ~3x slower there).

All functions compute ``a @ b`` for 2-D integer operands exactly and return an integer tensor
(int32 when every partial sum provably fits, else int64).

Overflow bound: with int8 codes |a_ik b_kj| <= 128 * 128 = 2**14, so a K-long int32 sum is safe
for K <= (2**31 - 1) // 2**14 = 131071.  Longer reductions are split into chunks of that length
whose int32 partials are summed in int64 (this is what keeps e.g. a weight-gradient GEMM over
batch x tokens exact).

int16 operands are computed exactly with int8 kernels by splitting each code into two int8 halves,
``a = 256 * hi + lo + 128`` with ``hi = floor(a / 256)`` and ``lo = (a mod 256) - 128``, both in
[-128, 127]; then ``a @ b = 256 (hi @ b) + lo @ b + 128 * colsum(b)``.  The halves are stacked so
that one int8 GEMM computes all partial products (2 products for int16 x int8, 4 for int16 x int16).
"""

from __future__ import annotations

import torch

from . import native
from .fused import dequant_epilogue
from .counters import count
from .workspace import scratch

__all__ = [
    "INT8_SAFE_K",
    "int_mm_reference",
    "int8_mm",
    "int_mm",
    "split_int16",
    "has_int_mm",
    "int8_gemm_kernel",
    "gemm_layout",
]

INT8_SAFE_K = (2**31 - 1) // (128 * 128)  # 131071


def has_int_mm(device: torch.device | str) -> bool:
    """Whether ``torch._int_mm`` exists and runs on this device type (cpu or cuda)."""
    return hasattr(torch, "_int_mm") and torch.device(device).type in ("cpu", "cuda")


def int_mm_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact ``a @ b`` in int64 (the test oracle; slow)."""
    _check_operands(a, b)
    return a.to(torch.int64) @ b.to(torch.int64)


def _check_operands(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"integer GEMM needs 2-D operands, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"integer GEMM shape mismatch: ({a.shape[0]}x{a.shape[1]}) @ ({b.shape[0]}x{b.shape[1]})")
    for t in (a, b):
        if t.dtype not in (torch.int8, torch.int16):
            raise TypeError(f"integer GEMM operands must be int8 or int16, got {t.dtype}")


def gemm_layout(m: torch.Tensor) -> torch.Tensor:
    """``m`` itself if its strides are ones oneDNN's GEMM reads correctly, else a row-major copy.

    ``torch._int_mm`` on CPU passes strides to oneDNN unchecked, and a matrix with a size-1
    dimension can carry strides such as (1, 1) that the GEMM misreads as a too-small leading
    dimension: it then returns wrong numbers silently (found by the exactness tests, e.g.
    ``a @ w.t()`` with K = 1).  Row- or column-major layouts with a proper leading dimension pass.
    """
    rows, cols = m.shape
    s0, s1 = m.stride()
    if s1 == 1 and s0 >= max(1, cols):  # row-major
        return m
    if s0 == 1 and s1 >= max(1, rows) and min(rows, cols) > 1:  # column-major
        return m
    return torch.empty((rows, cols), dtype=m.dtype, device=m.device).copy_(m)


def int8_gemm_kernel(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The machine's exact int8 x int8 -> int32 GEMM kernel, uncounted (K <= INT8_SAFE_K; ``out``: CPU only):
    AMX tiles where the CPU has them; the native AVX2 GEMM where it has no int8 dot-product instruction (there
    ``torch._int_mm`` runs a reference loop); else ``torch._int_mm`` (oneDNN VNNI GEMM); on CUDA
    :func:`_int_mm_cuda`."""
    if a.device.type != "cuda":
        if a.dtype == torch.int8 and b.dtype == torch.int8 and a.device.type == "cpu":
            if native.amx_available():  # torch._int_mm's oneDNN GEMM runs on VNNI, not AMX tiles
                return _k_chunked(native.int8_mm_amx, a, b, out)
            if native.avx2_gemm_preferred():
                return _k_chunked(native.int8_mm_avx2, a, b, out)
        a, b = gemm_layout(a), gemm_layout(b)
        return torch._int_mm(a, b) if out is None else torch.ops.aten._int_mm.out(a, b, out=out)
    return _int_mm_cuda(a, b)


def _k_chunked(kernel, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``kernel(a, b, out)`` for a native GEMM that takes K <= INT8_SAFE_K, over longer K as int32 sums of
    K-chunks: what ``torch._int_mm`` returns for such K, exact whenever the caller bounds the sum of the
    products' magnitudes below 2^31 (as the convolution weight gradient's batch chunks do: their padded
    rows add K but no products)."""
    k = a.shape[1]
    if k <= INT8_SAFE_K:
        return kernel(a, b, out)
    out = kernel(a[:, :INT8_SAFE_K], b[:INT8_SAFE_K], out)
    for k0 in range(INT8_SAFE_K, k, INT8_SAFE_K):
        out += kernel(a[:, k0 : k0 + INT8_SAFE_K], b[k0 : k0 + INT8_SAFE_K])
    return out


def _cuda_operand(t: torch.Tensor, rows: int, cols: int, row_major: bool) -> torch.Tensor:
    """``t`` zero-padded to [rows, cols] in the given layout; ``t`` itself where it already is that."""
    if tuple(t.shape) == (rows, cols) and t.stride() == ((cols, 1) if row_major else (1, rows)):
        return t
    out = t.new_zeros((rows, cols)) if row_major else t.new_zeros((cols, rows)).t()
    out[: t.shape[0], : t.shape[1]] = t
    return out


def _int_mm_cuda(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch._int_mm`` on CUDA, in the one operand layout cuBLASLt's int8 GEMM takes for every shape.

    cuBLASLt's int8 tensor-core GEMM wants "TN": ``a`` row-major, ``b`` column-major, and M > 16, K and N
    multiples of 8; other layouts and unaligned sizes fail with CUBLAS_STATUS_NOT_SUPPORTED for some shapes
    (seen on an H100, CUDA 13: e.g. row-major 17x8 @ 8x144).  Operands are copied into that layout with
    M, K, N padded to multiples of 16 (M at least 32) where they are not already so; zero rows and columns
    add nothing to the integer sums, so the result stays exact.
    """
    m, k = a.shape
    n = b.shape[1]
    mp, kp, np_ = max(32, -(-m // 16) * 16), -(-k // 16) * 16, -(-n // 16) * 16
    out = torch._int_mm(_cuda_operand(a, mp, kp, True), _cuda_operand(b, kp, np_, False))
    return out if (mp, np_) == (m, n) else out[:m, :n].contiguous()  # row-major, as the fake kernel says


def int8_mm(a: torch.Tensor, b: torch.Tensor, *, reuse_output: bool = False) -> torch.Tensor:
    """Exact int8 x int8 GEMM on ``torch._int_mm``; int32 result (int64 if K > INT8_SAFE_K).

    ``reuse_output=True`` writes into a per-shape scratch buffer (see :mod:`.workspace`) that the
    next call of the same shape overwrites: for callers that consume the result at once.
    """
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return torch.zeros(m, n, dtype=torch.int32, device=a.device)
    count("int8_mm")
    if k <= INT8_SAFE_K:
        out = scratch((m, n), torch.int32, a.device) if reuse_output and a.device.type != "cuda" else None
        return int8_gemm_kernel(a, b, out)
    out = torch.zeros(m, n, dtype=torch.int64, device=a.device)
    for k0 in range(0, k, INT8_SAFE_K):
        out += int8_gemm_kernel(a[:, k0 : k0 + INT8_SAFE_K], b[k0 : k0 + INT8_SAFE_K])
    return out


def split_int16(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split int16 codes into int8 halves ``(hi, lo)`` with ``x = 256 * hi + lo + 128`` exactly."""
    x32 = x.to(torch.int32)
    hi = torch.bitwise_right_shift(x32, 8)  # arithmetic: the floor of x / 256 (a division ran 5x slower)
    lo = (x32 - hi * 256) - 128
    return hi.to(torch.int8), lo.to(torch.int8)


def _int16_x_int8(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a int16, b int8: one GEMM of the stacked halves [hi; lo] @ b, recombined in int64."""
    m = a.shape[0]
    hi, lo = split_int16(a)
    # through int_mm: a compiled graph gets the int8 GEMM as its opaque, self-counting node (a plain int8_mm call
    # would count from inside the graph, a side effect that breaks it)
    p = int_mm(torch.cat([hi, lo]), b).to(torch.int64)
    colsum = b.to(torch.int64).sum(0, keepdim=True)
    return 256 * p[:m] + p[m:] + 128 * colsum


def int_mm(a: torch.Tensor, b: torch.Tensor, *, reuse_output: bool = False) -> torch.Tensor:
    """Exact integer GEMM for int8/int16 operands on int8 kernels (see module docstring).

    ``reuse_output``: see :func:`int8_mm` (applies to the int8 x int8 path).
    """
    _check_operands(a, b)
    if not has_int_mm(a.device):
        return int_mm_reference(a, b)
    if a.dtype == torch.int8 and b.dtype == torch.int8:
        if torch.compiler.is_compiling():  # one opaque graph node (see .ops); it counts itself when it runs
            return torch.ops.inttrain.int8_mm(a, b)
        return int8_mm(a, b, reuse_output=reuse_output)
    if a.dtype == torch.int16 and b.dtype == torch.int8:
        return _int16_x_int8(a, b)
    if a.dtype == torch.int8 and b.dtype == torch.int16:
        return _int16_x_int8(b.t(), a.t()).t()
    # int16 x int16: split b as well; a @ b = a @ (256 bh + bl) + 128 * rowsum(a)
    n = b.shape[1]
    bh, bl = split_int16(b)
    p = _int16_x_int8(a, torch.cat([bh, bl], dim=1))
    rowsum = a.to(torch.int64).sum(1, keepdim=True)
    return 256 * p[:, :n] + p[:, n:] + 128 * rowsum


@torch.compiler.assume_constant_result  # a compiled graph asks once, at trace time (the answer cannot change)
def _amx_gemm_available() -> bool:
    return native.amx_available()


def _dequant_scales_fit(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> bool:
    m, n = a.shape[0], b.shape[1]
    return (sa.dim() == 2 and tuple(sa.shape) in ((m, 1), (1, 1)) and sb.dim() == 2
            and tuple(sb.shape) in ((1, n), (1, 1)) and sa.dtype == sb.dtype == torch.float32)


def int_mm_dequant(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """``dequant_epilogue(int_mm(a, b), sa, sb)``: the float32 ``a @ b * sa * sb`` of int8 codes with their scales
    (``sa`` [M, 1] or [1, 1], ``sb`` [1, N] or [1, 1]), bit for bit.

    On CPUs with AMX the GEMM dequantizes each block while it is in cache (``native.int8_mm_amx_scaled``), so
    the int32 product never goes through memory: for a weight gradient, whose dequantized product goes straight
    to ``.grad``, that saves writing and reading it back (an MLP's 1024x1024 weight gradients: an int32 write,
    an int32 read and a float32 write became one float32 write).
    """
    _check_operands(a, b)
    fused = (a.dtype == torch.int8 and b.dtype == torch.int8 and a.device.type == "cpu" and a.shape[1] <= INT8_SAFE_K
             and min(a.shape[0], a.shape[1], b.shape[1]) > 0 and _dequant_scales_fit(a, b, sa, sb)
             and _amx_gemm_available())
    if not fused:
        return dequant_epilogue(int_mm(a, b, reuse_output=True), sa, sb)
    if torch.compiler.is_compiling():  # one opaque graph node (see .ops); it counts itself when it runs
        return torch.ops.inttrain.int8_mm_dequant(a, b, sa, sb)
    count("int8_mm")
    return native.int8_mm_amx_scaled(a, b, sa, sb)

