"""Integer helpers: rounding right shift, saturating left shift, saturation, requantization.

Everything here is exact integer arithmetic on int64 NumPy arrays (see docs/integer-training.md §2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROUNDING_MODES = ("rne", "pstoch", "floor", "hstoch")
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
    ``u > v`` (for ``s == 1`` there is no randomness and it falls back to ``rne``). ``hstoch``:
    unbiased stochastic rounding with no RNG state, the random number hashed from the value, its flat
    (C-order) position in ``x`` and ``s`` (:func:`hashed_round_up`). Shifts of 63 or more return 0
    (every int64 is below 2**63, so |x / 2**s| < 1/2 -> 0 for rne).
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
    if mode == "hstoch" and s <= 32:
        return hashed_round(x, s)
    q = x >> s                                  # floor division by 2**s
    if mode == "floor":
        return q
    r = x & ((1 << s) - 1)                      # discarded bits, 0 <= r < 2**s
    if mode == "hstoch":
        return q + hashed_round_up(x, r, s, np.arange(x.size, dtype=np.int64).reshape(x.shape))
    if mode == "pstoch" and s >= 2:
        m = s // 2
        u = r >> (s - m)
        v = r & ((1 << m) - 1)
        return q + (u > v)
    half = 1 << (s - 1)
    up = (r > half) | ((r == half) & ((q & 1) == 1))
    return q + up


_LOW32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9    # 2**32 / golden ratio: spreads consecutive positions and shifts over the 32-bit space


def hashed_round_up(x, r, s: int, index):
    """Whether ``hstoch`` rounds ``x / 2**s`` up: ``x`` int64 values, ``r`` their ``s`` discarded bits, ``index``
    their flat positions (int64 arrays of one shape; NumPy or torch: only operators are used).

    u = lowbias32(low32(x XOR index * G) XOR low32(s * G)), with G the golden-ratio constant and lowbias32
    Chris Wellons' 32-bit integer hash; x rounds up iff the top ``s`` bits of u are below ``r``
    (u < r / 2**(s - 32) for s > 32). Over the hash's values that is probability r / 2**s, so the rounding is
    unbiased -- the property error gradients need, which round-to-nearest lacks (it sends every error below
    half a step to 0, docs/integer-training.md §7) -- and reproducible: no generator state, the same bits in
    the C runtime (``it_shift_round``). The position matters: hashing the value alone rounds equal values
    alike everywhere, which kept most of rne's bias in measurement.  All products stay below 2**63 (the
    second multiplier is split in 16-bit halves), so int64 arithmetic gives the C uint32 results exactly.
    """
    h = ((x ^ (index * _GOLDEN)) & _LOW32) ^ ((s * _GOLDEN) & _LOW32)
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D) & _LOW32
    h = h ^ (h >> 15)
    h = (h * 0xA68B + (((h * 0x846C) & 0xFFFF) << 16)) & _LOW32     # h * 0x846CA68B mod 2**32
    h = h ^ (h >> 16)
    return (h >> (32 - s)) < r if s <= 32 else h < (r >> (s - 32))


_HASH_CHUNK = 1 << 16     # values per chunk of hashed_round: its ~15 passes then run in L2, not memory


def hashed_round(x: np.ndarray, s: int) -> np.ndarray:
    """``shift_round(x, s, "hstoch")`` for int32 (1 <= s <= 31) or int64 (1 <= s <= 32) ``x``, in its dtype: the
    hash of :func:`hashed_round_up` in NumPy's wrapping uint32 arithmetic, chunk by chunk so that its many
    elementwise passes stay in cache (measured on 2M int32 values: 20 ms against 35 ms for whole-array passes,
    and 108 ms for the int64 emulation; the hash was a third of an integer ResNet-20 step)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    q = flat >> s
    n = flat.size
    m = min(n, _HASH_CHUNK)
    h, t = np.empty(m, np.uint32), np.empty(m, np.uint32)
    salt = np.uint32((s * _GOLDEN) & _LOW32)
    for a in range(0, n, m):
        b = min(n, a + m)
        hc, tc, xc = h[:b - a], t[:b - a], flat[a:b]
        np.copyto(hc, xc, casting="unsafe")      # the low 32 bits, as C's (uint32_t) cast
        np.copyto(tc, np.arange(a, b, dtype=np.uint32))
        tc *= np.uint32(_GOLDEN)                 # wraps mod 2**32, as in C
        hc ^= tc
        hc ^= salt
        for shift, mult in ((16, 0x7FEB352D), (15, 0x846CA68B), (16, None)):
            np.right_shift(hc, shift, out=tc)
            hc ^= tc
            if mult is not None:
                hc *= np.uint32(mult)
        hc >>= 32 - s                            # the top s bits of the hash
        np.bitwise_and(xc, (1 << s) - 1, out=tc, casting="unsafe")   # the discarded bits r (< 2**s <= 2**32)
        q[a:b] += hc < tc                        # up with probability r / 2**s
    return q.reshape(x.shape)


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


def absmax(a: np.ndarray) -> int:
    """max |a| as a Python int (0 for an empty array), without a widening copy; ``a`` holds integers
    (integer dtype, or a float array whose values are exact integers)."""
    return max(int(a.max()), -int(a.min())) if a.size else 0


def shift_round_fast(x: np.ndarray, s: int, mode: str) -> np.ndarray:
    """``shift_round`` for 0 < s < 63 computed in ``x``'s own integer dtype with few passes.

    The caller guarantees that ``|x| + 2**(s-1)`` fits ``x``'s dtype (only ``rne`` adds) and that ``s`` is
    below the dtype's bit width. rne uses ``(x + 2**(s-1) - 1 + ((x >> s) & 1)) >> s``: with x = q 2**s + r
    the sum carries into q exactly when r > 2**(s-1), or r == 2**(s-1) and q is odd (§2).
    """
    if mode == "floor":
        return x >> s
    if mode == "hstoch":
        return hashed_round(x, s) if s <= 32 else shift_round(x, s, mode).astype(x.dtype)
    if mode == "pstoch" and s >= 2:
        m = s // 2
        r = x & ((1 << s) - 1)
        u = r >> (s - m)
        r &= (1 << m) - 1
        r -= u                                   # v - u < 0 exactly when rounding up
        r >>= x.dtype.itemsize * 8 - 1           # -1 where u > v, else 0 (same-dtype ops only: fast)
        q = x >> s
        q -= r
        return q
    t = x >> s
    t &= 1
    t += x
    t += (1 << (s - 1)) - 1
    t >>= s
    return t


_INT_FOR_BITS = {8: np.int8, 16: np.int16, 32: np.int32}


def requantize(acc: np.ndarray, exp: int, mode: str = "rne", bits: int = 8, amax: int | None = None) -> IntTensor:
    """Accumulator (value acc * 2**exp) -> ``bits``-bit codes, NITI style.

    The shift is the smallest that makes the largest magnitude fit: s = max(0, bitlen(max|acc|) -
    (bits - 1)); codes = saturate(shift_round(acc, s, mode)); the new exponent is exp + s. (After
    rounding a value can reach 2**(bits-1) exactly; saturation maps it to 2**(bits-1) - 1.)

    ``acc`` is an integer array or a float32/float64 array of exact integers (the exact GEMM's result,
    §3). Floats are rounded in float for ``rne``/``floor``: ``acc * 2**-s`` is exact (a power-of-two
    scaling of an integer), and ``rint`` (round half to even) / ``floor`` of it are the integer results.
    ``amax``: max|acc| when the caller has it already.
    """
    acc = np.asarray(acc)
    if acc.dtype.kind not in "iuf":
        acc = acc.astype(np.int64)
    m = absmax(acc) if amax is None else int(amax)
    s = max(0, m.bit_length() - (bits - 1))
    dtype = _INT_FOR_BITS[8 if bits <= 8 else (16 if bits <= 16 else 32)]
    if s == 0:                                   # |acc| <= 2**(bits-1) - 1: already codes
        return IntTensor(acc.astype(dtype), int(exp))
    qm = qmax(bits)
    if s >= 63:                                  # pragma: no cover - int64 inputs only
        return IntTensor(saturate(shift_round(acc.astype(np.int64), s, mode), bits).astype(dtype), int(exp) + s)
    if mode == "hstoch":                         # the hash needs the integer value (int32, or int64 for s > 24)
        y = shift_round_fast(acc if acc.dtype.kind == "i" and acc.dtype.itemsize >= 4 else acc.astype(np.int64), s,
                             mode)
    elif acc.dtype.kind == "f" and mode != "pstoch":
        y = acc * acc.dtype.type(2.0 ** -s)
        (np.rint if mode == "rne" else np.floor)(y, out=y)
    else:
        if acc.dtype.kind == "f" or acc.dtype.itemsize < 4 or acc.dtype.kind == "u":
            acc = acc.astype(np.int32 if m < (1 << 30) else np.int64)
        elif acc.dtype == np.int32 and m >= (1 << 30):
            acc = acc.astype(np.int64)
        y = shift_round_fast(acc, s, mode)
    np.clip(y, -qm, qm, out=y)                  # only +-2**(bits-1) can occur here
    return IntTensor(y.astype(dtype), int(exp) + s)


def rdiv(a: np.ndarray, m) -> np.ndarray:
    """round(a / m) for integers a and m >= 1 (a Python int or an array), halves up: (a + m // 2) // m."""
    return (np.asarray(a, dtype=np.int64) + m // 2) // m


def bitlen(r: np.ndarray) -> np.ndarray:
    """bit_length of non-negative integers < 2**17, elementwise (0 for 0): a batch norm's channel range, up to 254
    for int8 inputs and 65534 for 16-bit ones."""
    return (np.asarray(r, dtype=np.int64)[..., None] >= (1 << np.arange(17))).sum(-1)


def check_int32(acc: np.ndarray, what: str) -> np.ndarray:
    """Accumulators are int32 in the spec; the shapes are validated so this never fires."""
    if absmax(acc) > INT32_MAX:
        raise OverflowError(f"{what}: int32 accumulator overflow")
    return acc


class NumpyOps:
    """The array operations the integer engine is written against, on NumPy (the torch twin:
    :class:`inttrain.integer_only.ops.TorchOps`).

    The engine's arithmetic -- SGD update, softmax cross-entropy gradient, residual add, batch norm, average
    pool, containers -- is written once against this interface, so both engines run the same code; only these
    primitives differ, and each is exact integer arithmetic in both libraries.  Array operators (``+ - * //
    >> << & | == <``, indexing, ``reshape``, ``.shape``) are used directly: they mean the same in both."""

    IntTensor = IntTensor
    shift = staticmethod(shift)
    shift_round = staticmethod(shift_round)
    shift_left_saturate = staticmethod(shift_left_saturate)
    saturate = staticmethod(saturate)
    requantize = staticmethod(requantize)
    absmax = staticmethod(absmax)
    rdiv = staticmethod(rdiv)
    bitlen = staticmethod(bitlen)
    check_int32 = staticmethod(check_int32)
    clip = staticmethod(np.clip)
    where = staticmethod(np.where)
    moveaxis = staticmethod(np.moveaxis)
    broadcast_to = staticmethod(np.broadcast_to)

    @staticmethod
    def wide(a: np.ndarray) -> np.ndarray:
        return a.astype(np.int64)

    @staticmethod
    def int32(a: np.ndarray) -> np.ndarray:
        return a.astype(np.int32)

    @staticmethod
    def int8(a: np.ndarray) -> np.ndarray:
        return a.astype(np.int8)

    @staticmethod
    def int16(a: np.ndarray) -> np.ndarray:
        return a.astype(np.int16)

    @staticmethod
    def cast_like(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
        return a.astype(ref.dtype)

    @staticmethod
    def weight_grad(a: np.ndarray) -> np.ndarray:
        """A gradient accumulator as the optimizer receives it: NumPy keeps the exact int64 array."""
        return a

    @staticmethod
    def zeros(ref: np.ndarray, bits: int) -> np.ndarray:
        return np.zeros(ref.shape, dtype=np.int64 if bits == 64 else np.int32)

    @staticmethod
    def zeros_codes(shape: tuple[int, ...], like: np.ndarray) -> np.ndarray:
        """Zero codes of ``like``'s integer type (int8 or int16)."""
        return np.zeros(shape, dtype=like.dtype)

    @staticmethod
    def amax(a: np.ndarray, axis: int, keepdims: bool = False) -> np.ndarray:
        return a.max(axis=axis, keepdims=keepdims)

    @staticmethod
    def amin(a: np.ndarray, axis: int, keepdims: bool = False) -> np.ndarray:
        return a.min(axis=axis, keepdims=keepdims)

    @staticmethod
    def sum(a: np.ndarray, axis, keepdims: bool = False) -> np.ndarray:
        """Sum in int64 (no widening copy of ``a``)."""
        return a.sum(axis=axis, keepdims=keepdims, dtype=np.int64)

    @staticmethod
    def copy(a: np.ndarray) -> np.ndarray:
        return a.copy()

    @staticmethod
    def empty_like(a: np.ndarray) -> np.ndarray:
        return np.empty_like(a)

    @staticmethod
    def arange(n: int, like: np.ndarray) -> np.ndarray:
        return np.arange(n)

    @staticmethod
    def index(labels: np.ndarray, like: np.ndarray) -> np.ndarray:
        """Class labels usable as an index into ``like``."""
        return labels

    @staticmethod
    def table(t: np.ndarray, like: np.ndarray) -> np.ndarray:
        """The constant integer table ``t`` where ``like`` lives (NumPy: ``t`` itself)."""
        return t

