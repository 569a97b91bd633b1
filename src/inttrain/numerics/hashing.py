"""Counter-based uniform random numbers for stochastic rounding.

``torch.rand_like`` costs more than the int8 GEMM it would feed (~4.5 ms per million elements on a
2-core CPU), so stochastic rounding draws its uniforms from a stateless hash of
``(seed, element index)`` instead: the same seed gives the same bits on every device and in every
process, and under ``torch.compile`` the hash fuses into the quantize kernel at almost no cost.

The mixer is Chris Wellons' "lowbias32" integer hash (two multiply-xorshift rounds), evaluated in
int64 lanes masked to 32 bits so that it is identical in eager mode, compiled code and NumPy (eager CPU calls
take NumPy's wrapping uint32 arithmetic: the same bits, fewer memory passes).

Seeds: :func:`mix_seed` folds counters (base seed, layer id, call count, GEMM) into a per-call seed, and
:func:`derive_seed` gives every other random stream its seed from one of those, named by a
:class:`SeedPurpose` -- no seed salt is written anywhere else.
"""

from __future__ import annotations

import enum

import numpy as np
import torch

from ..oplib import operator

__all__ = ["uniform_from_counter", "mix_seed", "mix_seed_tensor", "advance_seeds", "SeedPurpose", "derive_seed"]

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def _lowbias32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D) & _MASK32
    h = h ^ (h >> 15)
    h = (h * 0x846CA68B) & _MASK32
    return h ^ (h >> 16)


def mix_seed(*parts: int) -> int:
    """Combine integers (base seed, layer id, step, GEMM id...) into one 32-bit seed, in pure Python."""
    h = 0
    for p in parts:
        h = (h ^ (int(p) & _MASK32)) * 0x01000193 & _MASK32  # FNV-style fold
        h ^= h >> 13
    return h


class SeedPurpose(enum.IntEnum):
    """Why a seed is derived from another; the value is the purpose's salt, so streams drawn from one base seed
    never coincide.  The values are frozen: changing one changes every stochastic-rounding result it feeds."""

    #: a GEMM's rhs operand (the weight, or x in ``dW = dy^T x``); the lhs is rounded with the GEMM seed itself
    RHS_OPERAND = 0x5BD1E995
    #: a recipe hook's rounding of ``grad_output`` (e.g. DSGC clipping), from the weight-gradient GEMM's seed
    GRAD_HOOK = 0x2545F491
    #: the GEMM seeds of one per-sample precision group, with the group's forward bits as the counter
    SAMPLE_GROUP = 0x5E9A
    #: FracTrain DFQ's Gumbel-softmax gate noise, with (step, gate index) as the counters
    GATE_NOISE = 0x6A7E


def derive_seed(seed: int | torch.Tensor, purpose: SeedPurpose, *counters: int) -> int | torch.Tensor:
    """The seed of ``purpose``'s random stream, derived from ``seed`` (the one place seeds get their salts).

    Without ``counters``: ``seed ^ purpose`` -- a single xor, so ``seed`` may be a compiled step's 0-d int64
    seed tensor and the result stays in its graph.  With counters: ``mix_seed(seed, *counters, purpose)``.

    >>> derive_seed(7, SeedPurpose.GRAD_HOOK) == 7 ^ 0x2545F491
    True
    """
    if counters:
        return mix_seed(seed, *counters, int(purpose))  # type: ignore[arg-type]
    return seed ^ int(purpose)


def mix_seed_tensor(*parts: int | torch.Tensor) -> torch.Tensor:
    """:func:`mix_seed` on 0-d int64 tensors (any part may be a tensor): bit-identical, and traceable, so a
    compiled step derives per-call seeds from a counter buffer without a recompile per value."""
    h: int | torch.Tensor = 0
    for p in parts:
        p = p & _MASK32 if isinstance(p, torch.Tensor) else int(p) & _MASK32
        h = ((h ^ p) * 0x01000193) & _MASK32  # < 2**57: exact in int64
        h = h ^ (h >> 13)
    return h if isinstance(h, torch.Tensor) else torch.tensor(h, dtype=torch.int64)


_NUMPY_CHUNK = 1 << 16  # values hashed per NumPy step: its uint32 temporaries stay in L2


def _uniform_numpy(n: int, seed: int) -> torch.Tensor:
    """:func:`uniform_from_counter`'s values by NumPy's wrapping uint32 arithmetic, in cache-sized chunks: the
    same bits as the int64 lanes (the hash works modulo 2^32 either way), ~3x faster in eager mode, where each
    torch op of the int64 emulation is a pass over an 8-byte-per-value temporary."""
    out = np.empty(n, dtype=np.float32)
    base = np.arange(min(n, _NUMPY_CHUNK), dtype=np.uint32)
    golden, s = np.uint32(_GOLDEN), np.uint32(seed & _MASK32)
    m1, m2, unit = np.uint32(0x7FEB352D), np.uint32(0x846CA68B), np.float32(1.0 / (1 << 24))
    for start in range(0, n, _NUMPY_CHUNK):
        h = base[: min(_NUMPY_CHUNK, n - start)] + np.uint32(start)
        h *= golden
        h += s
        h ^= h >> np.uint32(16)
        h *= m1
        h ^= h >> np.uint32(15)
        h *= m2
        h ^= h >> np.uint32(16)
        np.multiply((h >> np.uint32(8)).astype(np.float32), unit, out=out[start : start + h.shape[0]])
    return torch.from_numpy(out)


def uniform_from_counter(
    shape: torch.Size | tuple[int, ...], seed: int | torch.Tensor, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """float32 uniforms in ``[0, 1)`` with 24 random bits each, a pure function of ``(seed, index)``.

    ``seed`` may be a 0-d int64 tensor, so a compiled caller does not recompile for every new seed.
    """
    n = 1
    for d in shape:
        n *= int(d)
    on_cpu = torch.device(device).type == "cpu"
    if on_cpu and not torch.compiler.is_compiling() and 0 < n < (1 << 32):
        return _uniform_numpy(n, int(seed)).reshape(shape)  # eager CPU: the same values, fewer memory passes
    if on_cpu and n < (1 << 31):
        return _uniform_int32(n, seed).reshape(shape)  # compiled CPU code: native 32-bit multiplies
    return _uniform_int64(n, seed, device).reshape(shape)


def _uniform_int32(n: int, seed: int | torch.Tensor) -> torch.Tensor:
    """:func:`uniform_from_counter`'s flat values in int32 lanes (compiled CPU graphs, ``n < 2^31``): the same bits.

    The hash works modulo 2^32, so int32 lanes whose multiplies wrap give it directly; the logical right shifts
    are arithmetic shifts masked to the bits a logical one keeps.  Inductor's C++ vectorizes the int32 multiply
    (VPMULLD), where on AVX2 its int64 one is emulated lane by lane: a 2M-element hash took 8.9 ms in int64 lanes
    and 4.0 ms here (AMD EPYC Zen 3, one thread)."""
    idx = torch.arange(n, dtype=torch.int32)
    if isinstance(seed, torch.Tensor):
        seed32 = (((seed & _MASK32) ^ 0x80000000) - 0x80000000).to(torch.int32)  # the same 32 bits, signed
    else:
        seed32 = ((int(seed) & _MASK32) ^ 0x80000000) - 0x80000000
    h = idx * _signed32(_GOLDEN) + seed32
    h = h ^ ((h >> 16) & 0xFFFF)
    h = h * _signed32(0x7FEB352D)
    h = h ^ ((h >> 15) & 0x1FFFF)
    h = h * _signed32(0x846CA68B)
    h = h ^ ((h >> 16) & 0xFFFF)
    return ((h >> 8) & 0xFFFFFF).to(torch.float32) * (1.0 / (1 << 24))


def _signed32(v: int) -> int:
    """The int32 with ``v``'s 32 bits."""
    return ((v & _MASK32) ^ 0x80000000) - 0x80000000


def _uniform_int64(n: int, seed: int | torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """:func:`uniform_from_counter`'s flat values in int64 lanes masked to 32 bits (compiled graphs, other devices)."""
    idx = torch.arange(n, dtype=torch.int64, device=device)
    seed = seed & _MASK32 if isinstance(seed, torch.Tensor) else int(seed) & _MASK32
    # `& _MASK32` first (a no-op on the values): a bitwise op makes Inductor compute the position as a value in
    # int64 lanes.  Without it the product folds into a Triton index expression, whose literals must fit int32
    # ("Scalar 2654435769 is out of range for type int32", and past a 2-D tile's row stride even for
    # the int32-sized congruent multiplier).
    h = _lowbias32(((idx & _MASK32) * _GOLDEN + seed) & _MASK32)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def _advance_seeds_fake(counter, seed, layer_id, gemms):
    return counter.new_empty((gemms,))


@operator("advance_seeds(Tensor(a!) counter, int seed, int layer_id, int gemms) -> Tensor", _advance_seeds_fake)
def _advance_seeds(counter: torch.Tensor, seed: int, layer_id: int, gemms: int) -> torch.Tensor:
    calls = int(counter) + 1  # runs eagerly (an opaque node): Python ints are the cheapest here
    counter.fill_(calls)
    return torch.tensor([mix_seed(seed, layer_id, calls, g) for g in range(gemms)], dtype=torch.int64,
                        device=counter.device)


def advance_seeds(counter: torch.Tensor, seed: int, layer_id: int, gemms: int = 3) -> torch.Tensor:
    """Increment a layer's 0-d call counter in place and return ``[mix_seed(seed, layer_id, calls, g) for g]``.

    One opaque operator on purpose: a compiled step must not recompute the seeds in backward from a counter
    that forward has already advanced (AOTAutograd's partitioner recomputes cheap elementwise ops).
    """
    return torch.ops.inttrain.advance_seeds(counter, int(seed), int(layer_id), int(gemms))
