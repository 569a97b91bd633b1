"""Integer helpers on torch integer tensors (docs/integer-training.md §1-§3).

The twin of :mod:`inttrain.micro.ops`: rounding right shift (rne / pstoch / floor / hstoch), saturating left
shift, symmetric saturation and NITI requantization, all exact integer ops on int64 tensors. Scale
exponents are plain Python ints. No floating-point tensor is ever created.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..kernels.matmul import int_mm
from ..micro.ops import INT8_MAX, INT32_MAX, ROUNDING_MODES, hashed_round_up, qmax  # the format: one definition

INT32_LIMIT = INT32_MAX
MAX_K = INT32_LIMIT // (127 * 127)   # 133144 (§8)

_DTYPE_FOR_BITS = {8: torch.int8, 16: torch.int16, 32: torch.int32}


@dataclass
class IntTensor:
    """Integer codes ``q`` (a torch integer tensor) with one power-of-two exponent: value = q * 2**exp."""

    q: torch.Tensor
    exp: int

    def to_float(self) -> torch.Tensor:
        """Dequantized float64 view (tests and display only; never used by a training step)."""
        return self.q.to(torch.float64) * (2.0 ** self.exp)


def saturate(x: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Clamp to the symmetric range [-(2**(bits-1)-1), 2**(bits-1)-1] (int64 result)."""
    m = qmax(bits)
    return torch.clamp(x.to(torch.int64), -m, m)


def absmax(x: torch.Tensor) -> int:
    """max |x| as a Python int (0 for an empty tensor), without a widening copy."""
    if x.numel() == 0:
        return 0
    return max(int(x.max()), -int(x.min()))


def shift_round(x: torch.Tensor, s: int, mode: str = "rne") -> torch.Tensor:
    """x / 2**s rounded to an integer (s >= 0), int64 result; see §2 for the modes."""
    if mode not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding mode {mode!r}; expected one of {ROUNDING_MODES}")
    x = x.to(torch.int64)
    s = int(s)
    if s < 0:
        raise ValueError("shift_round needs s >= 0; use shift_left_saturate for left shifts")
    if s == 0:
        return x.clone()
    if s >= 63:
        return torch.zeros_like(x)
    q = x >> s                                    # arithmetic (flooring) shift on signed ints
    if mode == "floor":
        return q
    r = x & ((1 << s) - 1)                        # the s discarded bits
    if mode == "hstoch":
        index = torch.arange(x.numel(), dtype=torch.int64, device=x.device).reshape(x.shape)
        return q + hashed_round_up(x, r, s, index).to(torch.int64)
    if mode == "pstoch" and s >= 2:
        m = s // 2
        u = r >> (s - m)
        v = r & ((1 << m) - 1)
        return q + (u > v).to(torch.int64)
    half = 1 << (s - 1)
    up = (r > half) | ((r == half) & ((q & 1) == 1))
    return q + up.to(torch.int64)


def shift_left_saturate(x: torch.Tensor, k: int, limit: int = INT32_MAX) -> torch.Tensor:
    """x * 2**k saturated to [-limit, limit] without int64 overflow (k >= 0)."""
    x = x.to(torch.int64)
    k = int(k)
    if k >= 62:
        return torch.sign(x) * limit
    bound = (limit >> k) + 1
    return torch.clamp(torch.clamp(x, -bound, bound) << k, -limit, limit)


def shift(x: torch.Tensor, s: int, mode: str = "rne", limit: int = INT32_MAX) -> torch.Tensor:
    """Multiply by 2**-s: rounding right shift for s >= 0, saturating left shift for s < 0."""
    return shift_round(x, s, mode) if s >= 0 else shift_left_saturate(x, -s, limit)


def requantize(acc: torch.Tensor, exp: int, mode: str = "rne", bits: int = 8) -> IntTensor:
    """Accumulator (value acc * 2**exp) -> ``bits``-bit codes: s = max(0, bitlen(max|acc|) - (bits-1))."""
    m = absmax(acc)
    s = max(0, m.bit_length() - (bits - 1))
    q = saturate(shift_round(acc, s, mode), bits)
    return IntTensor(q.to(_DTYPE_FOR_BITS[8 if bits <= 8 else (16 if bits <= 16 else 32)]), int(exp) + s)


def check_int32(acc: torch.Tensor, what: str) -> torch.Tensor:
    """The spec's accumulators are int32; shapes are validated so this never fires."""
    if absmax(acc) > INT32_LIMIT:
        raise OverflowError(f"{what}: int32 accumulator overflow")
    return acc


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact integer a @ b on the project's integer kernel (torch._int_mm); int32 (int64 if K is huge)."""
    return int_mm(a, b)


def rdiv(a: torch.Tensor, m: int | torch.Tensor) -> torch.Tensor:
    """round(a / m), halves up: (a + m // 2) // m (``m`` a Python int or a tensor of them)."""
    return torch.div(a.to(torch.int64) + m // 2, m, rounding_mode="floor")


_POW2 = [1 << i for i in range(17)]


def bitlen(r: torch.Tensor) -> torch.Tensor:
    """bit_length of non-negative integers < 2**17, elementwise (0 for 0; micro's ``bitlen``)."""
    p = torch.tensor(_POW2, dtype=torch.int64, device=r.device)
    return (r.to(torch.int64).unsqueeze(-1) >= p).sum(-1)


class _DeviceTables:
    """Owner of the copies of constant integer tables (e.g. the loss's exp2 table) on each device, made on
    first use per (table, device); :meth:`clear` drops them."""

    def __init__(self) -> None:
        self._copies: dict[tuple[int, torch.device], tuple[np.ndarray, torch.Tensor]] = {}

    def get(self, t: np.ndarray, device: torch.device) -> torch.Tensor:
        key = (id(t), device)
        hit = self._copies.get(key)
        if hit is None:                              # t is kept with its copy, so its id is never reused
            hit = self._copies[key] = (t, torch.from_numpy(np.array(t, copy=True)).to(device))
        return hit[1]

    def clear(self) -> None:
        self._copies.clear()


DEVICE_TABLES = _DeviceTables()


class TorchOps:
    """:class:`inttrain.micro.ops.NumpyOps` on torch integer tensors (exact, device-agnostic): the primitives
    the shared integer engine (SGD, loss, residual add, batch norm, average pool, containers) runs on.  See
    NumpyOps for what each means; a gradient stays int32 here (``weight_grad``), as the GEMM kernels give it."""

    IntTensor = IntTensor
    shift, shift_round, shift_left_saturate, saturate, requantize, absmax, rdiv, bitlen, check_int32 = map(
        staticmethod, (shift, shift_round, shift_left_saturate, saturate, requantize, absmax, rdiv, bitlen, check_int32))
    clip, where, moveaxis = staticmethod(torch.clamp), staticmethod(torch.where), staticmethod(torch.movedim)
    wide = staticmethod(lambda a: a.to(torch.int64))
    int32 = weight_grad = staticmethod(lambda a: a.to(torch.int32))
    int8 = staticmethod(lambda a: a.to(torch.int8))
    int16 = staticmethod(lambda a: a.to(torch.int16))
    cast_like = staticmethod(lambda a, ref: a.to(ref.dtype))
    zeros = staticmethod(lambda ref, bits: torch.zeros(ref.shape, dtype=torch.int64 if bits == 64 else torch.int32,
                                                       device=ref.device))
    zeros_codes = staticmethod(lambda shape, like: torch.zeros(shape, dtype=like.dtype, device=like.device))
    broadcast_to = staticmethod(lambda a, shape: a.expand(shape))
    amax = staticmethod(lambda a, axis, keepdims=False: a.amax(dim=axis, keepdim=keepdims))
    amin = staticmethod(lambda a, axis, keepdims=False: a.amin(dim=axis, keepdim=keepdims))
    sum = staticmethod(lambda a, axis, keepdims=False: a.sum(dim=axis, keepdim=keepdims, dtype=torch.int64))
    copy = staticmethod(torch.clone)
    empty_like = staticmethod(torch.empty_like)
    arange = staticmethod(lambda n, like: torch.arange(n, device=like.device))
    index = staticmethod(lambda labels, like: labels.to(device=like.device, dtype=torch.int64))
    table = staticmethod(lambda t, like: DEVICE_TABLES.get(t, like.device))
