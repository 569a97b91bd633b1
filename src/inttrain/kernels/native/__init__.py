"""Native kernels where the library kernels leave speed on the table (see ``conv.c``, ``quantize.c``,
``gemm_amx.c`` and ``gemm_avx2.c``).

The C source is compiled on first use with the machine's C compiler (plain C, no torch headers:
about a second) into a shared library that :class:`NativeLibrary` owns, and called through
``ctypes`` on tensors' data pointers.  ``make setup`` builds it up front.  Where it cannot run
(no compiler, a CPU without the kernel's instructions: AVX512-VNNI, AMX or AVX2, not CPU, a build error)
:func:`available` (and its kin) is False and callers keep their torch path; the reason is logged once.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from ..workspace import scratch

__all__ = ["NativeLibrary", "LIBRARY", "QUANTIZE_LIBRARY", "available", "quantize_available",
           "conv2d_weight_grad_int", "conv2d_weight_grad_float", "quantize_rows_cols",
           "conv_forward_supported", "conv2d_forward_u8s8", "GEMM_LIBRARY", "amx_available", "int8_mm_amx",
           "CONV_AMX_LIBRARY", "conv_amx_available", "conv_kernel", "int8_mm_amx_scaled", "wide_combine",
           "GEMM_AVX2_LIBRARY", "avx2_gemm_available", "avx2_gemm_preferred", "int8_mm_avx2",
           "CONV_AVX2_LIBRARY", "avx2_conv_preferred", "conv2d_forward_avx2", "conv2d_weight_grad_avx2",
           "conv2d_weight_grad_float_avx2", "avx2_weight_grad_fits"]

_LOG = logging.getLogger(__name__)
_SOURCE = Path(__file__).with_name("conv.c")
_QUANTIZE_SOURCE = Path(__file__).with_name("quantize.c")
_GEMM_SOURCE = Path(__file__).with_name("gemm_amx.c")
_GEMM_AVX2_SOURCE = Path(__file__).with_name("gemm_avx2.c")
_CONV_AMX_SOURCE = Path(__file__).with_name("conv_amx.c")
_CONV_AVX2_SOURCE = Path(__file__).with_name("conv_avx2.c")
_BATCH_NORM_SOURCE = Path(__file__).with_name("batch_norm.c")
# -fopenmp: the parallel sections run on torch's OpenMP team (libgomp.so.1, already loaded by torch)
_FLAGS = ("-O3", "-fPIC", "-shared", "-pthread", "-fopenmp", "-std=c11")


def _cache_dirs() -> list[Path]:
    """Where the built library may live: beside the source (an editable install), else the user's cache."""
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [_SOURCE.parent / "_build", Path(xdg) / "inttrain"]


class NativeLibrary:
    """One C source compiled once per (source, flags, compiler) and loaded once; owns its build file.

    ``load()`` returns the ``ctypes.CDLL`` or None (with ``reason`` set).  Thread-safe; the build writes
    to a temporary file and renames it, so concurrent processes never load a half-written library.
    """

    def __init__(self, source: Path, flags: tuple[str, ...] = _FLAGS, compiler: str | None = None,
                 setup: Callable[[ctypes.CDLL], None] | None = None) -> None:
        self.source, self.flags = source, flags
        self.setup = setup or _setup_conv  # checks the CPU and declares the entry points; raises RuntimeError
        self.compiler = compiler or os.environ.get("CC", "cc")
        self.reason: str | None = None
        self._lib: ctypes.CDLL | None = None
        self._tried = False
        self._lock = threading.Lock()
        self._queries: dict[str, bool] = {}

    def _name(self) -> str:
        headers = b"".join(h.read_bytes() for h in sorted(self.source.parent.glob("*.h")))  # what it may include
        digest = hashlib.sha256(self.source.read_bytes() + headers + " ".join((self.compiler, *self.flags)).encode())
        return f"lib{self.source.stem}-{digest.hexdigest()[:16]}.so"

    def build(self) -> Path:
        """Compile (if not built yet) and return the library's path; raises RuntimeError on failure."""
        name, errors = self._name(), []
        for folder in _cache_dirs():
            path = folder / name
            if path.exists():
                return path
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
                os.close(fd)
            except OSError as exc:
                errors.append(f"{folder}: {exc.strerror}")
                continue
            try:
                cmd = [self.compiler, *self.flags, str(self.source), "-o", tmp]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[:500]}")
                os.replace(tmp, path)
                for stale in folder.glob(f"lib{self.source.stem}-*.so"):  # earlier sources' builds
                    if stale != path:
                        stale.unlink(missing_ok=True)
                return path
            except FileNotFoundError as exc:
                raise RuntimeError(f"no C compiler ({self.compiler}): {exc}") from None
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        raise RuntimeError("no writable folder for the native kernels: " + "; ".join(errors))

    def load(self) -> ctypes.CDLL | None:
        with self._lock:
            if not self._tried:
                self._tried = True
                try:
                    lib = ctypes.CDLL(str(self.build()))
                    self.setup(lib)
                    self._lib = lib
                except (RuntimeError, OSError) as exc:
                    self.reason = str(exc)
                    _LOG.info("native int8 kernels unavailable (%s): using the torch kernels", exc)
            return self._lib

    def query(self, name: str) -> bool:
        """The library's argument-free ``int name(void)`` (a CPU or OS check), asked once and remembered: False
        when the library is unavailable.  Remembered here because the answer cannot change within a process."""
        answer = self._queries.get(name)
        if answer is None:
            lib = self.load()
            answer = self._queries[name] = bool(lib is not None and getattr(lib, name)())
        return answer


def _setup_conv(lib: ctypes.CDLL) -> None:
    lib.inttrain_has_vnni.restype = ctypes.c_int
    if not lib.inttrain_has_vnni():
        raise RuntimeError("this CPU has no AVX512-VNNI")
    lib.inttrain_wgrad_u8s8.restype = ctypes.c_int
    lib.inttrain_wgrad_u8s8.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_int64]
    lib.inttrain_wgrad_f32.restype = ctypes.c_int
    lib.inttrain_wgrad_f32.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 6
                                       + [ctypes.c_int64])
    lib.inttrain_conv_amx_ready.restype = ctypes.c_int
    lib.inttrain_wgrad_amx_scratch.restype = None
    lib.inttrain_wgrad_amx_scratch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.inttrain_wgrad_u8s8_amx.restype = ctypes.c_int
    lib.inttrain_wgrad_u8s8_amx.argtypes = lib.inttrain_wgrad_u8s8.argtypes
    lib.inttrain_wgrad_f32_amx.restype = ctypes.c_int
    lib.inttrain_wgrad_f32_amx.argtypes = lib.inttrain_wgrad_f32.argtypes
    lib.inttrain_conv_fwd_u8s8.restype = ctypes.c_int
    lib.inttrain_conv_lane_width.restype = ctypes.c_int64
    lib.inttrain_conv_lane_width.argtypes = [ctypes.c_int64] * 5
    lib.inttrain_conv_fwd_u8s8.argtypes = ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p,
                                           ctypes.c_int64] + [ctypes.c_void_p] * 3 + [ctypes.c_int64])
    lib.inttrain_wide_combine.restype = ctypes.c_int
    lib.inttrain_wide_combine.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3
                                          + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p,
                                             ctypes.c_int64])


def _setup_quantize(lib: ctypes.CDLL) -> None:
    lib.inttrain_has_avx512.restype = ctypes.c_int
    if not lib.inttrain_has_avx512():
        raise RuntimeError("this CPU has no AVX512F/BW")
    lib.inttrain_quantize_rows_cols.restype = ctypes.c_int
    lib.inttrain_quantize_rows_cols.argtypes = (
        [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float]
        + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2)


def _setup_gemm(lib: ctypes.CDLL) -> None:
    lib.inttrain_has_amx.restype = ctypes.c_int
    if not lib.inttrain_has_amx():
        raise RuntimeError("this CPU has no AMX-INT8 (or the kernel does not let this process use its tiles)")
    lib.inttrain_gemm_amx_workspace.restype = None
    lib.inttrain_gemm_amx_workspace.argtypes = [ctypes.c_int64] * 5 + [ctypes.c_void_p]
    lib.inttrain_gemm_s8s8s32.restype = ctypes.c_int
    lib.inttrain_gemm_s8s8s32.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64]
    lib.inttrain_gemm_s8s8f32.restype = ctypes.c_int
    lib.inttrain_gemm_s8s8f32.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] + [ctypes.c_void_p] * 2 + [ctypes.c_int64]


def _setup_gemm_avx2(lib: ctypes.CDLL) -> None:
    lib.inttrain_has_avx2.restype = ctypes.c_int
    if not lib.inttrain_has_avx2():
        raise RuntimeError("this CPU has no AVX2")
    lib.inttrain_gemm_avx2_workspace.restype = None
    lib.inttrain_gemm_avx2_workspace.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.inttrain_gemm_avx2_s8s8s32.restype = ctypes.c_int
    lib.inttrain_gemm_avx2_s8s8s32.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64]


# The forward convolutions' arguments (conv_amx.c, conv_avx2.c): x, w, x_scale, w_scale, flags, dims, scratch,
# out, threads.
_FORWARD_ARGTYPES = ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_int64]
                     + [ctypes.c_void_p] * 3 + [ctypes.c_int64])


def _declare(lib: ctypes.CDLL, signatures: dict[str, tuple]) -> None:
    """Set each entry point's ``(restype, argtypes)``."""
    for name, (restype, argtypes) in signatures.items():
        entry = getattr(lib, name)
        entry.restype, entry.argtypes = restype, argtypes


def _setup_conv_amx(lib: ctypes.CDLL) -> None:
    lib.inttrain_conv_has_amx.restype = ctypes.c_int
    if not lib.inttrain_conv_has_amx():
        raise RuntimeError("this CPU has no AMX-INT8 (or the kernel does not let this process use its tiles)")
    _declare(lib, {"inttrain_conv_amx_scratch": (ctypes.c_int64, [ctypes.c_void_p]),
                   "inttrain_conv_fwd_amx_u8s8": (ctypes.c_int, _FORWARD_ARGTYPES)})


def _setup_conv_avx2(lib: ctypes.CDLL) -> None:
    lib.inttrain_conv_avx2_ready.restype = ctypes.c_int
    if not lib.inttrain_conv_avx2_ready():
        raise RuntimeError("this CPU has no AVX2")
    _declare(lib, {"inttrain_conv_avx2_scratch": (ctypes.c_int64, [ctypes.c_void_p]),
                   "inttrain_conv_fwd_avx2": (ctypes.c_int, _FORWARD_ARGTYPES),
                   "inttrain_wgrad_avx2_scratch": (None, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]),
                   "inttrain_wgrad_avx2": (ctypes.c_int, [ctypes.c_void_p] * 6 + [ctypes.c_int64]),
                   "inttrain_wgrad_f32_avx2": (ctypes.c_int, [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 4
                                               + [ctypes.c_void_p] * 5 + [ctypes.c_int64])})


def _setup_batch_norm(lib: ctypes.CDLL) -> None:
    _declare(lib, {"inttrain_bn_backward_u8": (ctypes.c_int, [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
                                               + [ctypes.c_void_p] * 7 + [ctypes.c_int64])})


LIBRARY = NativeLibrary(_SOURCE)
QUANTIZE_LIBRARY = NativeLibrary(_QUANTIZE_SOURCE, setup=_setup_quantize)
GEMM_LIBRARY = NativeLibrary(_GEMM_SOURCE, setup=_setup_gemm)
GEMM_AVX2_LIBRARY = NativeLibrary(_GEMM_AVX2_SOURCE, setup=_setup_gemm_avx2)
CONV_AMX_LIBRARY = NativeLibrary(_CONV_AMX_SOURCE, setup=_setup_conv_amx)
CONV_AVX2_LIBRARY = NativeLibrary(_CONV_AVX2_SOURCE, setup=_setup_conv_avx2)
BATCH_NORM_LIBRARY = NativeLibrary(_BATCH_NORM_SOURCE, setup=_setup_batch_norm)


def batch_norm_available() -> bool:
    """Whether the native batch-norm backward from uint8 codes runs here (any x86-64 CPU with a C compiler)."""
    return BATCH_NORM_LIBRARY.load() is not None


def batch_norm_backward_u8(codes: Tensor, scale: Tensor, g: Tensor, mean: Tensor, invstd: Tensor, weight: Tensor,
                           threads: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Training batch-norm backward of channels-last rows whose input is ``scale * (codes - 128)``.

    ``codes`` uint8 ``[M, C]``, ``g`` float32 ``[M, C]`` (both contiguous, CPU), ``scale``, ``mean``, ``invstd``,
    ``weight`` float32 ``[C]``.  Returns ``(dx, dweight, dbias)`` (see ``batch_norm.c``)."""
    lib = BATCH_NORM_LIBRARY.load()
    if lib is None:
        raise RuntimeError(f"native batch norm unavailable: {BATCH_NORM_LIBRARY.reason}")
    if codes.dtype != torch.uint8 or g.dtype != torch.float32 or codes.shape != g.shape or g.dim() != 2:
        raise TypeError(f"batch_norm_backward_u8 takes uint8 codes and float32 g of one [M, C] shape, got "
                        f"{codes.dtype} {tuple(codes.shape)} and {g.dtype} {tuple(g.shape)}")
    m, c = g.shape
    per_channel = [t.contiguous().float() for t in (scale.reshape(-1), mean.reshape(-1), invstd.reshape(-1),
                                                    weight.reshape(-1))]
    if any(t.numel() != c for t in per_channel) or any(t.device.type != "cpu" for t in (codes, g)):
        raise TypeError("batch_norm_backward_u8 takes CPU tensors with one scale, mean, invstd and weight per channel")
    codes, g = codes.contiguous(), g.contiguous()
    dx, dw, db = torch.empty_like(g), g.new_empty(c), g.new_empty(c)
    if lib.inttrain_bn_backward_u8(codes.data_ptr(), g.data_ptr(), m, c, *(t.data_ptr() for t in per_channel),
                                   dx.data_ptr(), dw.data_ptr(), db.data_ptr(),
                                   threads or torch.get_num_threads()) != 0:
        raise MemoryError("batch_norm_backward_u8: out of memory for its per-thread sums")
    return dx, dw, db


def available() -> bool:
    """Whether the native weight-gradient kernel runs on this machine (builds it on first call)."""
    return LIBRARY.load() is not None


def quantize_available() -> bool:
    """Whether the native two-way gradient quantizer runs on this machine (builds it on first call)."""
    return QUANTIZE_LIBRARY.load() is not None


def amx_available() -> bool:
    """Whether the AMX int8 GEMM runs on this machine (builds it on first call)."""
    return GEMM_LIBRARY.load() is not None


def avx2_gemm_available() -> bool:
    """Whether the AVX2 int8 GEMM runs on this machine (builds it on first call)."""
    return GEMM_AVX2_LIBRARY.load() is not None


def avx2_gemm_preferred() -> bool:
    """Whether the AVX2 int8 GEMM is the CPU's int8 GEMM: it runs here and the CPU has no int8 dot-product
    instruction (AVX512-VNNI / AVX-VNNI), without which oneDNN's GEMM behind ``torch._int_mm`` runs a reference
    loop (4096x1024x1024: 9.0 s against 87 ms here, one thread, AMD EPYC Zen 3)."""
    return avx2_gemm_available() and not GEMM_AVX2_LIBRARY.query("inttrain_has_int8_dot")


def avx2_conv_preferred(groups: int, terms: int = 0) -> bool:
    """Whether the AVX2 convolutions (:func:`conv2d_forward_avx2`, :func:`conv2d_weight_grad_avx2`) are this
    machine's int8 convolutions: the CPU has no int8 dot-product instruction (where oneDNN's int8 convolution
    saturates, :func:`~inttrain.kernels.conv.onednn_int8_conv_exact`), the kernels run here, the convolution is
    ungrouped and int32 holds the forward's ``terms`` (Ci rounded up to even, times KH * KW) exactly."""
    return groups == 1 and terms <= _GEMM_MAX_K and avx2_gemm_preferred() and CONV_AVX2_LIBRARY.load() is not None


def avx2_weight_grad_fits(ho: int, wo: int) -> bool:
    """Whether :func:`conv2d_weight_grad_avx2` takes a gradient of ``ho x wo`` pixels: an image's pixel pairs,
    ``ho * ceil(wo / 2)``, at most 65535 (each int32 lane then sums them exactly before its int64 flush)."""
    return ho * -(-wo // 2) <= 65535


def conv_amx_available() -> bool:
    """Whether the AMX int8 convolution runs on this machine (builds it on first call)."""
    return CONV_AMX_LIBRARY.load() is not None


def conv_kernel(kind: str, ci: int, stride: tuple[int, int], dilation: tuple[int, int]) -> str:
    """Which native kernel runs an ungrouped convolution on this machine: ``"amx"`` or ``"vnni"``.

    ``kind``: ``"forward"`` (also the input gradient's sub-pixel convolution) takes AMX tiles at stride 1 without
    dilation (``conv_amx.c``); ``"weight_grad"`` at stride 1 with Ci a multiple of 16 (``conv.c``).
    """
    if kind == "forward":
        return "amx" if tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and conv_amx_available() else "vnni"
    if kind == "weight_grad":
        ready = tuple(stride) == (1, 1) and ci % 16 == 0 and LIBRARY.query("inttrain_conv_amx_ready")
        return "amx" if ready else "vnni"
    raise ValueError(f"kind must be 'forward' or 'weight_grad', got {kind!r}")


def int8_mm_amx(a: Tensor, b: Tensor, out: Tensor | None = None, threads: int | None = None) -> Tensor:
    """Exact ``a @ b`` of int8 CPU matrices [M, K] x [K, N] (any strides) as int32 on AMX tiles.

    What ``torch._int_mm`` computes, bit for bit (int32 sums: K <= 131071).  ``out``: a row-major int32
    [M, N] to write into.  Call only when :func:`amx_available`.
    """
    return _amx_gemm(a, b, out, torch.int32, threads, None)


def int8_mm_amx_scaled(a: Tensor, b: Tensor, row_scale: Tensor, col_scale: Tensor, threads: int | None = None) -> Tensor:
    """``a @ b`` as :func:`int8_mm_amx`, dequantized in the same pass: float32 ``(float32(sum) * row_scale) *
    col_scale``, bit for bit ``int8_mm_amx(a, b).float() * row_scale * col_scale`` (``row_scale`` [M, 1] or one
    value, ``col_scale`` [1, N] or one value, float32), without the int32 product in memory."""
    m, n = int(a.shape[0]), int(b.shape[1])
    rows = row_scale.to(torch.float32).reshape(-1).contiguous()
    cols = col_scale.to(torch.float32).reshape(-1).contiguous()
    if rows.numel() not in (1, m) or cols.numel() not in (1, n) or rows.numel() == 0 or cols.numel() == 0:
        raise ValueError(f"scales must have 1 or {m} (rows) and 1 or {n} (columns) values, got {rows.numel()}, "
                         f"{cols.numel()}")
    flags = (_PER_ROW if rows.numel() == m and m > 1 else 0) | (_PER_COLUMN if cols.numel() == n and n > 1 else 0)
    return _amx_gemm(a, b, None, torch.float32, threads, (rows, cols, flags))


# inttrain_gemm_s8s8f32's scale_flags (gemm_amx.c)
_PER_ROW = 1  # one row scale per row of the product (else one for all)
_PER_COLUMN = 2  # one column scale per column


def int8_mm_avx2(a: Tensor, b: Tensor, out: Tensor | None = None, threads: int | None = None) -> Tensor:
    """Exact ``a @ b`` of int8 CPU matrices [M, K] x [K, N] (any strides) as int32 with AVX2 integer instructions.

    What ``torch._int_mm`` computes, bit for bit (int32 sums: K <= 131071), where that runs a reference loop
    (CPUs without AVX512-VNNI).  ``out``: a row-major int32 [M, N] to write into.  Call only when
    :func:`avx2_gemm_available`.
    """
    lib, out, dims = _gemm_operands(GEMM_AVX2_LIBRARY, a, b, out, torch.int32)
    if dims is None:
        return out
    threads = threads or torch.get_num_threads()
    sizes = (ctypes.c_int64 * 2)()
    lib.inttrain_gemm_avx2_workspace(dims, threads, sizes)
    work = scratch((int(sizes[0]) + int(sizes[1]),), torch.int8, a.device)  # one buffer: [Ap | Bp]
    status = lib.inttrain_gemm_avx2_s8s8s32(a.data_ptr(), b.data_ptr(), out.data_ptr(), dims, work.data_ptr(),
                                            work.data_ptr() + int(sizes[0]), threads)
    if status != 0:
        raise RuntimeError(f"native AVX2 GEMM failed (status {status})")
    return out


def _gemm_operands(library: NativeLibrary, a: Tensor, b: Tensor, out: Tensor | None,
                   dtype: torch.dtype) -> tuple[ctypes.CDLL, Tensor, ctypes.Array | None]:
    """The checks of the native GEMMs: (library, out, dims: m, n, k, sam, sak, sbk, sbn, ldc); dims None when
    there is nothing to multiply (``out`` is then already the product)."""
    lib = library.load()
    if lib is None:
        raise RuntimeError(f"native kernels unavailable: {library.reason}")
    if a.dtype != torch.int8 or b.dtype != torch.int8 or {a.device.type, b.device.type} != {"cpu"}:
        raise TypeError(f"expected int8 CPU matrices, got {a.dtype} on {a.device} and {b.dtype} on {b.device}")
    (m, k), n = a.shape, int(b.shape[1])
    if b.shape[0] != k or k > _GEMM_MAX_K:
        raise ValueError(f"cannot multiply {tuple(a.shape)} by {tuple(b.shape)} exactly in int32")
    if out is None:
        out = torch.empty((m, n), dtype=dtype)
    elif out.shape != (m, n) or out.dtype != dtype or out.stride(1) != 1:
        name = str(dtype).removeprefix("torch.")
        raise ValueError(f"out must be a row-major {name} [{m}, {n}], got {tuple(out.shape)} {out.dtype}")
    if m == 0 or n == 0:
        return lib, out, None
    if k == 0:
        return lib, out.zero_(), None
    return lib, out, _int64_array([m, n, k, *a.stride(), *b.stride(), out.stride(0)])


def _amx_gemm(a: Tensor, b: Tensor, out: Tensor | None, dtype: torch.dtype, threads: int | None,
              scales: tuple[Tensor, Tensor, int] | None) -> Tensor:
    lib, out, dims = _gemm_operands(GEMM_LIBRARY, a, b, out, dtype)
    if dims is None:
        return out
    sizes = (ctypes.c_int64 * 2)()
    lib.inttrain_gemm_amx_workspace(*dims[:5], sizes)  # m, n, k, sam, sak
    work = scratch((int(sizes[0]) + int(sizes[1]),), torch.int8, a.device)  # one buffer: [Ap | Bp]
    args = (a.data_ptr(), b.data_ptr(), out.data_ptr(), dims, work.data_ptr(), work.data_ptr() + int(sizes[0]),
            threads or torch.get_num_threads())
    if scales is None:
        status = lib.inttrain_gemm_s8s8s32(*args)
    else:
        status = lib.inttrain_gemm_s8s8f32(*args, scales[0].data_ptr(), scales[1].data_ptr(), scales[2])
    if status != 0:
        raise RuntimeError(f"native AMX GEMM failed (status {status})")
    return out


#: Longest reduction whose int32 sums of int8 x int8 products (|p| <= 2^14) cannot overflow.
_GEMM_MAX_K = ((1 << 31) - 1) // (128 * 128)


# The scale-layout argument of the native convolution entry points is a set of flags (conv.c / conv_amx.c):
_PER_CHANNEL = 1  # one scale per channel (else one for the tensor)
_BFLOAT16 = 2  # the forward writes bfloat16 / the weight gradient reads a bfloat16 dy


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def quantize_rows_cols(
    dy: Tensor, row_mul: Tensor | None, col_mul: Tensor | None, qmax: int, *, rows: bool = True,
    cols: bool = True, sr_rows: bool = False, seed_rows: int = 0, sr_cols: bool = False, seed_cols: int = 0,
    col_sum: bool = False, threads: int | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """Codes of ``dy * row_mul`` with one scale per row, and of ``dy * col_mul[:, None]`` with one per column.

    ``dy``: float32 or bfloat16 (read as its float32 upcast) [M, N] (made contiguous); ``row_mul`` [N] and ``col_mul`` [M] float32 or None (= 1).
    Returns ``(q_rows [M, N] int8, s_rows [M, 1], q_cols [M, N] int8, s_cols [1, N], sums [N])``, None for
    what is not asked for; ``sums`` (``col_sum=True``) are dy's column sums (a bias gradient), summed in double.  Bit for bit what :func:`inttrain.kernels.fused.quantize_matrix` gives for a symmetric signed
    format of ``qmax = 2**(bits-1) - 1`` (bits <= 8), per-channel scales, nearest-even or stochastic
    rounding (seeds as there).  Call only when :func:`quantize_available`.
    """
    lib = QUANTIZE_LIBRARY.load()
    if lib is None:
        raise RuntimeError(f"native kernels unavailable: {QUANTIZE_LIBRARY.reason}")
    if dy.dim() != 2 or dy.dtype not in (torch.float32, torch.bfloat16) or dy.device.type != "cpu":
        raise TypeError(f"expected a 2-D float32 or bfloat16 CPU tensor, got {tuple(dy.shape)} {dy.dtype} on {dy.device}")
    if not 1 <= qmax <= 127:
        raise ValueError(f"qmax must be in [1, 127] (int8 codes), got {qmax}")
    dy = dy.contiguous()
    m, n = dy.shape
    mults = []
    for mul, size, name in ((row_mul, n, "row_mul"), (col_mul, m, "col_mul")):
        if mul is not None:
            mul = mul.reshape(-1).to(torch.float32).contiguous()
            if mul.numel() != size:
                raise ValueError(f"{name} has {mul.numel()} values, expected {size}")
        mults.append(mul)
    q_rows = torch.empty((m, n), dtype=torch.int8) if rows else None
    s_rows = torch.empty((m, 1), dtype=torch.float32) if rows else None
    q_cols = torch.empty((m, n), dtype=torch.int8) if cols else None
    s_cols = torch.empty((1, n), dtype=torch.float32) if cols else None
    threads = threads or torch.get_num_threads()
    sums = torch.zeros((n,), dtype=torch.float32) if col_sum else None
    colmax = scratch((threads * n,), torch.int32, dy.device) if cols else None
    colsum = scratch((threads * n,), torch.float64, dy.device) if col_sum else None
    if m and n:
        lib.inttrain_quantize_rows_cols(
            dy.data_ptr(), m, n, _ptr(mults[0]), _ptr(mults[1]), float(qmax), _ptr(q_rows), _ptr(s_rows),
            _ptr(q_cols), _ptr(s_cols), int(sr_rows), int(seed_rows) & 0xFFFFFFFF, int(sr_cols),
            int(seed_cols) & 0xFFFFFFFF, _ptr(colmax), _ptr(sums), _ptr(colsum), int(dy.dtype == torch.bfloat16),
            threads)
    elif m or n:
        for s in (s_rows, s_cols):
            if s is not None:
                s.fill_(1.0)
    return q_rows, s_rows, q_cols, s_cols, sums


def _int64_array(values: list[int]) -> ctypes.Array:
    return (ctypes.c_int64 * len(values))(*values)


def _wgrad_buffers(n: int, co: int, ci: int, h: int, w: int, ho: int, wo: int, kw: int, padding: tuple[int, int],
                   stride: tuple[int, int], dilation: tuple[int, int], device: torch.device,
                   allocate: bool = True) -> tuple[Tensor | None, Tensor | None, int]:
    """The packing scratch of the VNNI weight-gradient kernel: (gp, xph, phase row width); only the width
    when not ``allocate`` (the AMX kernel sizes its own)."""
    (ph, pw), sw, dw = padding, stride[1], dilation[1]
    cot, wo4 = -(-co // 16), -(-wo // 4)
    # Each phase row holds the padded columns of its phase and the 4-pixel groups' overreach.
    width = max(-(-(w + 2 * pw) // sw), (dw * (kw - 1)) // sw + 4 * wo4)
    if not allocate:
        return None, None, width
    gp = scratch((n * cot * ho * wo4 * 64,), torch.int8, device)
    xph = scratch((n * ci * (h + 2 * ph) * sw * width,), torch.uint8, device)
    return gp, xph, width


def _run_wgrad(g: Tensor, xu8: Tensor, weight_shape: tuple, stride: tuple[int, int], padding: tuple[int, int],
               dilation: tuple[int, int], threads: int | None, float_args: tuple | None) -> Tensor:
    """Call one of the entry points of ``conv.c`` (``float_args``: (scale, per_channel, qmax, sr, seed)): on AMX
    tiles where the CPU has them and the convolution suits them (stride 1, Ci a multiple of 16), else VNNI."""
    lib = LIBRARY.load()
    if lib is None:
        raise RuntimeError(f"native kernels unavailable: {LIBRARY.reason}")
    co, ci, kh, kw = (int(v) for v in weight_shape)
    n, _, h, w = (int(v) for v in xu8.shape)
    ho, wo = int(g.shape[2]), int(g.shape[3])
    amx = conv_kernel("weight_grad", ci, stride, dilation) == "amx"
    gp, xph, width = _wgrad_buffers(n, co, ci, h, w, ho, wo, kw, padding, stride, dilation, g.device, not amx)
    out = torch.empty((co, ci * kh * kw), dtype=torch.int64)
    dims = _int64_array([n, co, ci, kh, kw, h, w, ho, wo, *padding, *stride, *dilation, width,
                         int(xu8.dtype == torch.int8)])
    if amx:
        sizes = (ctypes.c_int64 * 2)()
        lib.inttrain_wgrad_amx_scratch(dims, sizes)
        gp = scratch((int(sizes[0]),), torch.int8, g.device)
        xph = scratch((int(sizes[1]),), torch.uint8, g.device)
    tail = (xu8.data_ptr(), _int64_array(list(xu8.stride())), dims, gp.data_ptr(), xph.data_ptr(), out.data_ptr(),
            threads or torch.get_num_threads())
    if float_args is None:
        entry = lib.inttrain_wgrad_u8s8_amx if amx else lib.inttrain_wgrad_u8s8
        status = entry(g.data_ptr(), _int64_array(list(g.stride())), *tail)
    else:
        entry = lib.inttrain_wgrad_f32_amx if amx else lib.inttrain_wgrad_f32
        status = entry(g.data_ptr(), _int64_array(list(g.stride())), *float_args, *tail)
    if status != 0:
        raise RuntimeError(f"native weight gradient failed (status {status})")
    return out.view(co, ci, kh, kw)


def _check_input_codes(xu8: Tensor, g: Tensor, g_dtype: torch.dtype, what: str) -> None:
    if g.dtype != g_dtype or xu8.dtype not in (torch.uint8, torch.int8) or {g.device.type, xu8.device.type} != {"cpu"}:
        raise TypeError(f"expected a CPU {what} gradient and uint8/int8 input codes, got {g.dtype} and {xu8.dtype}")


def conv2d_weight_grad_int(
    gq: Tensor, xu8: Tensor, weight_shape: tuple, stride: tuple[int, int], padding: tuple[int, int],
    dilation: tuple[int, int], threads: int | None = None,
) -> Tensor:
    """Exact int64 ``sum_{n,oh,ow} gq * q`` as ``[Co, Ci, KH, KW]`` for an ungrouped convolution.

    ``gq``: int8 gradient codes [N, Co, Ho, Wo]; ``xu8``: the forward input's codes [N, Ci, H, W],
    either shifted (uint8 q + 128, what the forward convolution consumed) or int8 q; any strides
    (channels-last is the fast layout).  Call only when :func:`available`.
    """
    _check_input_codes(xu8, gq, torch.int8, "int8")
    return _run_wgrad(gq, xu8, weight_shape, stride, padding, dilation, threads, None)


def conv2d_weight_grad_avx2(
    gq: Tensor, xu8: Tensor, weight_shape: tuple, stride: tuple[int, int], padding: tuple[int, int],
    dilation: tuple[int, int], threads: int | None = None,
) -> Tensor:
    """:func:`conv2d_weight_grad_int` on AVX2 integer instructions (``conv_avx2.c``: pixel pairs in int16,
    VPMADDWD, no im2col): exact int64 ``[Co, Ci, KH, KW]``, any channel counts.  Both operands are read
    channels-last (other layouts are copied first).  Call only when :func:`avx2_conv_preferred` (or the library
    loads: it runs, exactly, on any AVX2 CPU)."""
    _check_input_codes(xu8, gq, torch.int8, "int8")
    return _run_wgrad_avx2(gq, xu8, weight_shape, stride, padding, dilation, threads, None)


def conv2d_weight_grad_float_avx2(
    dy: Tensor, g_scale: Tensor, qmax: int, stochastic: bool, seed: int, xu8: Tensor, weight_shape: tuple,
    stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int], threads: int | None = None,
) -> Tensor:
    """:func:`conv2d_weight_grad_float` on AVX2 (the gradient quantized while the kernel packs it, the same codes
    bit for bit).  Call only when :func:`avx2_conv_preferred`."""
    _check_input_codes(xu8, dy, torch.bfloat16 if dy.dtype == torch.bfloat16 else torch.float32, "float32/bfloat16")
    return _run_wgrad_avx2(dy, xu8, weight_shape, stride, padding, dilation, threads,
                           _float_gradient_args(dy, g_scale, qmax, stochastic, seed, int(weight_shape[0])))


def _float_gradient_args(dy: Tensor, g_scale: Tensor, qmax: int, stochastic: bool, seed: int,
                         co: int) -> tuple[Tensor, int, int, int, int]:
    """The float-gradient arguments of the native weight gradients: (scales, flags, qmax, stochastic, seed)."""
    if not 1 <= qmax <= 127:
        raise ValueError(f"qmax must be in [1, 127] (int8 codes), got {qmax}")
    scale = g_scale.reshape(-1).to(torch.float32).contiguous()
    if scale.numel() not in (1, co):
        raise ValueError(f"g_scale has {scale.numel()} values, expected 1 or {co}")
    flags = (_PER_CHANNEL if scale.numel() == co and co > 1 else 0) | (_BFLOAT16 if dy.dtype == torch.bfloat16 else 0)
    return scale, flags, int(qmax), int(stochastic), int(seed) & 0xFFFFFFFF


def _run_wgrad_avx2(g: Tensor, xu8: Tensor, weight_shape: tuple, stride: tuple[int, int], padding: tuple[int, int],
                    dilation: tuple[int, int], threads: int | None, float_args: tuple | None) -> Tensor:
    lib = CONV_AVX2_LIBRARY.load()
    if lib is None:
        raise RuntimeError(f"native kernels unavailable: {CONV_AVX2_LIBRARY.reason}")
    co, ci, kh, kw = (int(v) for v in weight_shape)
    n, _, h, w = (int(v) for v in xu8.shape)
    out = torch.empty((co, ci, kh, kw), dtype=torch.int64)
    if n == 0 or out.numel() == 0:
        return out.zero_()
    if not avx2_weight_grad_fits(int(g.shape[2]), int(g.shape[3])):
        raise ValueError(f"a {int(g.shape[2])}x{int(g.shape[3])} gradient has more than 65535 pixel pairs an image")
    g = g.contiguous(memory_format=torch.channels_last)  # held: C reads them
    x = xu8.contiguous(memory_format=torch.channels_last)
    dims = _int64_array([n, co, ci, kh, kw, h, w, int(g.shape[2]), int(g.shape[3]), *padding, *stride, *dilation,
                         int(x.dtype == torch.int8)])
    threads = threads or torch.get_num_threads()
    sizes = (ctypes.c_int64 * 2)()
    lib.inttrain_wgrad_avx2_scratch(dims, threads, sizes)
    work = scratch((int(sizes[0]) // 2,), torch.int16, g.device)
    partial = scratch((int(sizes[1]) // 8,), torch.int64, g.device)
    tail = (x.data_ptr(), dims, work.data_ptr(), partial.data_ptr(), out.data_ptr(), threads)
    if float_args is None:
        status = lib.inttrain_wgrad_avx2(g.data_ptr(), *tail)
    else:
        scale, *rest = float_args
        status = lib.inttrain_wgrad_f32_avx2(g.data_ptr(), scale.data_ptr(), *rest, *tail)
    if status != 0:
        raise RuntimeError(f"native AVX2 weight gradient failed (status {status})")
    return out


def conv2d_weight_grad_float(
    dy: Tensor, g_scale: Tensor, qmax: int, stochastic: bool, seed: int, xu8: Tensor, weight_shape: tuple,
    stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int], threads: int | None = None,
) -> Tensor:
    """:func:`conv2d_weight_grad_int` of the codes of a float32 (or bfloat16) gradient, quantized inside the kernel.

    The codes are ``clamp(round(dy / g_scale), -qmax, qmax)`` (``g_scale``: one value, or one per output
    channel), rounded to nearest even or stochastically with ``seed``: bit for bit the codes
    :func:`inttrain.kernels.fused.quantize_matrix` gives for ``dy``'s channels-last ``[N*Ho*Wo, Co]`` view with
    that scale.  Call only when :func:`available`.
    """
    _check_input_codes(xu8, dy, torch.bfloat16 if dy.dtype == torch.bfloat16 else torch.float32, "float32/bfloat16")
    scale, *rest = _float_gradient_args(dy, g_scale, qmax, stochastic, seed, int(weight_shape[0]))
    float_args = (scale.data_ptr(), *rest)
    return _run_wgrad(dy, xu8, weight_shape, stride, padding, dilation, threads, float_args)


#: Longest reduction (Ci * KH * KW) whose int32 sums of |u8 * int8| <= 255 * 128 products cannot overflow.
_FWD_MAX_TERMS = ((1 << 31) - 1) // (255 * 128)


def conv_forward_supported(ci: int, kh: int, kw: int, groups: int) -> bool:
    """Whether :func:`conv2d_forward_u8s8` takes this convolution (and the library loads): ungrouped, input
    channels a multiple of 4 (4 codes per VNNI lane), a reduction int32 holds exactly."""
    return groups == 1 and ci % 4 == 0 and ci * kh * kw <= _FWD_MAX_TERMS and available()


def _forward_operands(xu8: Tensor, x_scale: float, wq: Tensor, w_scale: Tensor, stride: tuple[int, int],
                      padding: tuple[int, int], dilation: tuple[int, int], out_dtype: torch.dtype, direct: bool,
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple, ctypes.Array]:
    """The checks and operands of the native forward convolutions: (out, x, w, scale, (x_scale, scale pointer,
    flags, dims), dims); ``out`` is float32 unless ``direct`` (the kernel writes ``out_dtype`` itself)."""
    if xu8.dtype != torch.uint8 or wq.dtype != torch.int8 or {xu8.device.type, wq.device.type} != {"cpu"}:
        raise TypeError(f"expected CPU uint8 codes and int8 weights, got {xu8.dtype} and {wq.dtype}")
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
    n, ci, h, w = (int(v) for v in xu8.shape)
    co, _, kh, kw = (int(v) for v in wq.shape)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = torch.empty((n, co, ho, wo), dtype=out_dtype if direct else torch.float32, memory_format=torch.channels_last)
    x, w_codes = xu8.contiguous(memory_format=torch.channels_last), wq.contiguous()  # held: C reads them
    scale = w_scale.reshape(-1).to(torch.float32).contiguous()
    dims = _int64_array([n, ci, h, w, co, kh, kw, ho, wo, ph, pw, sh, sw, dh, dw])
    args = (float(x_scale), scale.data_ptr(), _PER_CHANNEL if scale.numel() > 1 else 0, dims)
    return out, x, w_codes, scale, args, dims


def conv2d_forward_u8s8(
    xu8: Tensor, x_scale: float, wq: Tensor, w_scale: Tensor, stride: tuple[int, int], padding: tuple[int, int],
    dilation: tuple[int, int], threads: int | None = None, out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """``conv2d(q, wq) * x_scale * w_scale[co]`` from shifted codes ``xu8 = q + 128`` (uint8, padding = code 0).

    The sums are exact (int32, corrected by ``128 * sum(w)``); one float32 multiply scales them.  ``xu8``
    [N, Ci, H, W] (channels-last is read in place, other layouts are copied), ``wq`` int8 [Co, Ci, KH, KW],
    ``w_scale`` Co values or one.  Returns float32 [N, Co, Ho, Wo], channels-last, or that rounded to bfloat16
    (``out_dtype``; the AMX kernel writes it directly).  Call only when :func:`conv_forward_supported`.
    """
    lib = LIBRARY.load()
    if lib is None:
        raise RuntimeError(f"native kernels unavailable: {LIBRARY.reason}")
    amx = conv_kernel("forward", int(xu8.shape[1]), stride, dilation) == "amx"
    direct = out_dtype == torch.float32 or amx  # the AMX kernel writes bfloat16 itself
    out, x, w_codes, _scale, args, dims = _forward_operands(xu8, x_scale, wq, w_scale, stride, padding, dilation,
                                                            out_dtype, direct)
    if out.numel() == 0:
        return out.to(out_dtype)
    n, ci, h, w, co, _, kw, _, wo, ph, pw, sh, sw, _, dw = dims
    threads = threads or torch.get_num_threads()
    if amx:  # AMX tiles (conv_amx.c), which write bfloat16 themselves
        lib_amx = CONV_AMX_LIBRARY.load()
        xp = scratch((lib_amx.inttrain_conv_amx_scratch(dims),), torch.uint8, xu8.device)
        flags = args[2] | (_BFLOAT16 if out_dtype == torch.bfloat16 else 0)
        status = lib_amx.inttrain_conv_fwd_amx_u8s8(x.data_ptr(), w_codes.data_ptr(), args[0], args[1], flags, dims,
                                                    xp.data_ptr(), out.data_ptr(), threads)
        if status == 4:  # no AVX512-BF16 for the conversion: float32, then torch rounds it
            return conv2d_forward_u8s8(xu8, x_scale, wq, w_scale, stride, padding, dilation, threads).to(out_dtype)
    else:
        if co <= 16 and (sh, sw) == (1, 1):  # the pixels-in-lanes kernel repacks x (see conv.c)
            lane = lib.inttrain_conv_lane_width(w, pw, wo, kw, dw)
            xp = scratch((n * (h + 2 * ph) * ci * lane,), torch.uint8, xu8.device)
        else:
            xp = scratch((n * (h + 2 * ph) * (w + 2 * pw) * ci,), torch.uint8, xu8.device) if ph or pw else x
        status = lib.inttrain_conv_fwd_u8s8(x.data_ptr(), w_codes.data_ptr(), *args, xp.data_ptr(), out.data_ptr(),
                                            threads)
    if status != 0:
        raise RuntimeError(f"native convolution failed (status {status})")
    return out if direct else out.to(out_dtype)


def conv2d_forward_avx2(
    xu8: Tensor, x_scale: float, wq: Tensor, w_scale: Tensor, stride: tuple[int, int], padding: tuple[int, int],
    dilation: tuple[int, int], threads: int | None = None, out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """:func:`conv2d_forward_u8s8` on AVX2 integer instructions (``conv_avx2.c``: int16 codes, VPMADDWD, no
    im2col), bit for bit the same result, any number of input channels.  Call only when
    :func:`avx2_conv_preferred` (or the library loads: it runs, exactly, on any AVX2 CPU)."""
    lib = CONV_AVX2_LIBRARY.load()
    if lib is None:
        raise RuntimeError(f"native kernels unavailable: {CONV_AVX2_LIBRARY.reason}")
    out, x, w_codes, _scale, args, dims = _forward_operands(xu8, x_scale, wq, w_scale, stride, padding, dilation,
                                                            out_dtype, direct=False)
    if out.numel() == 0:
        return out.to(out_dtype)
    if (dims[1] + dims[1] % 2) * dims[5] * dims[6] > _GEMM_MAX_K:
        raise ValueError(f"a reduction of {dims[1] * dims[5] * dims[6]} terms does not fit int32 exactly")
    xp = scratch((lib.inttrain_conv_avx2_scratch(dims) // 2,), torch.int16, xu8.device)
    status = lib.inttrain_conv_fwd_avx2(x.data_ptr(), w_codes.data_ptr(), *args, xp.data_ptr(), out.data_ptr(),
                                        threads or torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"native AVX2 convolution failed (status {status})")
    return out.to(out_dtype)


def wide_combine(parts: list[tuple[float, Tensor]], channels: int, scale: Tensor, base: float,
                 threads: int | None = None) -> Tensor:
    """``(sum_p weight_p * part_p) * scale[c] * base`` in float64, rounded once to float32, in one pass.

    ``parts``: (weight, float32 integer sums) pairs, each ``[N, channels, H, W]`` laid out channels-last, or a
    channel slice of such a tensor (a convolution of stacked weights hands on several parts in one tensor);
    ``scale``: ``channels`` values or one.  Returns float32 ``[N, channels, H, W]``, channels-last.  Exact
    while the weighted sums stay below 2^53.  Call only when :func:`available`.
    """
    lib = LIBRARY.load()
    if lib is None:
        raise RuntimeError(f"native kernels unavailable: {LIBRARY.reason}")
    first = parts[0][1]
    n, _, h, w = (int(v) for v in first.shape)
    views = [part for _, part in parts]
    for v in views:  # pixel rows of `channels` floats at a fixed stride: channels-last tensors or channel slices
        ld = v.stride(3)
        if v.dtype != torch.float32 or v.device.type != "cpu" or tuple(v.shape) != (n, channels, h, w) or \
                v.stride(1) != 1 or ld < channels or v.stride(2) != w * ld or v.stride(0) != h * w * ld:
            raise ValueError("wide_combine takes float32 CPU parts [N, C, H, W] laid out channels-last")
    out = torch.empty((n, channels, h, w), dtype=torch.float32, memory_format=torch.channels_last)
    if out.numel() == 0:
        return out
    sc = scale.reshape(-1).to(torch.float32).contiguous()
    if sc.numel() not in (1, channels):
        raise ValueError(f"scale has {sc.numel()} values, expected 1 or {channels}")
    pointers = (ctypes.c_void_p * len(views))(*[v.data_ptr() for v in views])
    lds = _int64_array([int(v.stride(3)) for v in views])  # channels-last: a pixel's channels are one row
    weights = (ctypes.c_double * len(parts))(*[float(wt) for wt, _ in parts])
    status = lib.inttrain_wide_combine(pointers, lds, weights, len(views), n * h * w, channels, sc.data_ptr(),
                                       int(sc.numel() > 1), float(base), out.data_ptr(),
                                       threads or torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"native combine failed (status {status})")
    return out
