"""Integer helpers: rounding right shift, saturating left shift, saturation, requantization.

Everything here is exact integer arithmetic on int64 NumPy arrays (see docs/integer-training.md §2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROUNDING_MODES = ("rne", "pstoch", "floor")
INT8_MAX = 127          # symmetric int8: -128 is never produced (saturation is to [-127, 127])
INT32_MAX = 2**31 - 1


@dataclass
class IntTensor:
    """Integer codes ``q`` with one power-of-two scale exponent: real value = q * 2**exp."""

    q: np.ndarray
    exp: int

    def to_float(self) -> np.ndarray:
        """Dequantized view (for tests and display only; training never uses it)."""
        return self.q.astype(np.float64) * (2.0 ** self.exp)


def qmax(bits: int) -> int:
    """Largest code of a symmetric ``bits``-bit signed format: 2**(bits-1) - 1."""
    return (1 << (bits - 1)) - 1


def saturate(x: np.ndarray, bits: int = 8) -> np.ndarray:
    """Clamp to the symmetric range [-(2**(bits-1)-1), 2**(bits-1)-1] (int64 result)."""
    m = qmax(bits)
    return np.clip(np.asarray(x, dtype=np.int64), -m, m)


def shift_round(x: np.ndarray, s: int, mode: str = "rne") -> np.ndarray:
    """x / 2**s rounded to an integer, for int64 ``x`` and shift ``s >= 0``.

    ``rne``: round half to even. ``floor``: arithmetic shift (toward -inf). ``pstoch``: NITI-style
    pseudo-stochastic rounding with no RNG: of the ``s`` discarded bits, the top ``m = s // 2`` bits
    are the fraction ``u`` and the bottom ``m`` bits are the "random" number ``v``; round up iff
    ``u > v`` (for ``s == 1`` there is no randomness and it falls back to ``rne``). Shifts of 63 or
    more return 0 (every int64 is below 2**63, so |x / 2**s| < 1/2 -> 0 for rne).
    """
    if mode not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding mode {mode!r}; expected one of {ROUNDING_MODES}")
    x = np.asarray(x, dtype=np.int64)
    s = int(s)
    if s < 0:
        raise ValueError("shift_round needs s >= 0; use shift_left_saturate for left shifts")
    if s == 0:
        return x.copy()
    if s >= 63:
        return np.zeros_like(x)
    q = x >> s                                  # floor division by 2**s
    if mode == "floor":
        return q
    r = x & ((1 << s) - 1)                      # discarded bits, 0 <= r < 2**s
    if mode == "pstoch" and s >= 2:
        m = s // 2
        u = r >> (s - m)
        v = r & ((1 << m) - 1)
        return q + (u > v)
    half = 1 << (s - 1)
    up = (r > half) | ((r == half) & ((q & 1) == 1))
    return q + up


def shift_left_saturate(x: np.ndarray, k: int, limit: int = INT32_MAX) -> np.ndarray:
    """x * 2**k saturated to [-limit, limit] without int64 overflow (k >= 0)."""
    x = np.asarray(x, dtype=np.int64)
    k = int(k)
    if k >= 62:
        return np.sign(x) * limit
    bound = (limit >> k) + 1                    # |x| > bound saturates anyway
    return np.clip(np.clip(x, -bound, bound) << k, -limit, limit)


def shift(x: np.ndarray, s: int, mode: str = "rne", limit: int = INT32_MAX) -> np.ndarray:
    """Multiply by 2**-s: rounding right shift for s >= 0, saturating left shift for s < 0."""
    return shift_round(x, s, mode) if s >= 0 else shift_left_saturate(x, -s, limit)


def requantize(acc: np.ndarray, exp: int, mode: str = "rne", bits: int = 8) -> IntTensor:
    """Int32/int64 accumulator (value acc * 2**exp) -> ``bits``-bit codes, NITI style.

    The shift is the smallest that makes the largest magnitude fit: s = max(0, bitlen(max|acc|) -
    (bits - 1)); codes = saturate(shift_round(acc, s, mode)); the new exponent is exp + s. (After
    rounding a value can reach 2**(bits-1) exactly; saturation maps it to 2**(bits-1) - 1.)
    """
    acc = np.asarray(acc, dtype=np.int64)
    m = int(np.abs(acc).max()) if acc.size else 0
    s = max(0, m.bit_length() - (bits - 1))
    q = saturate(shift_round(acc, s, mode), bits)
    dtype = np.int8 if bits <= 8 else (np.int16 if bits <= 16 else np.int32)
    return IntTensor(q.astype(dtype), int(exp) + s)
