"""Integer number formats, scale granularities and rounding modes: pure value objects.

A *format* fixes which integer codes exist; a *granularity* fixes which elements share one scale;
a *rounding* mode fixes how a real value becomes a code.  A real tensor ``x`` is represented as
``x ~= s * q`` with integer codes ``q`` in ``[qmin, qmax]`` and a positive real scale ``s``.

Nothing here imports torch: these objects are shared by the PyTorch path and the NumPy-only
device engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Union

from .errors import InttrainError

__all__ = [
    "MIN_BITS",
    "MAX_BITS",
    "UnsupportedFormatError",
    "Rounding",
    "Overflow",
    "ScaleKind",
    "IntFormat",
    "PerTensor",
    "PerChannel",
    "PerBlock",
    "PER_TENSOR",
    "PER_ROW",
    "PER_COLUMN",
    "Granularity",
    "QuantSpec",
]

MIN_BITS = 2
MAX_BITS = 16


class UnsupportedFormatError(InttrainError):
    """A bit width, granularity or mode that inttrain cannot represent or compute with."""


class Rounding(Enum):
    """How a real value ``v = x / s`` becomes an integer code (before saturation).

    - ``NEAREST_EVEN``: ``q = round(v)``, ties to the even integer (IEEE default; unbiased on ties).
    - ``STOCHASTIC``: ``q = floor(v + u)`` with ``u ~ U[0, 1)``, so ``E[q] = v`` (unbiased); the
      uniform bits come from a counter-based hash of (seed, element index): reproducible and cheap.
    - ``FLOOR``: ``q = floor(v)`` (what a right shift does on two's-complement integers).
    """

    NEAREST_EVEN = "nearest_even"
    STOCHASTIC = "stochastic"
    FLOOR = "floor"


class Overflow(Enum):
    """What happens to a code outside ``[qmin, qmax]``: saturate (clamp). Wrapping is never used."""

    SATURATE = "saturate"


class ScaleKind(Enum):
    """``FLOAT``: ``s = amax / qmax`` exactly. ``POW2``: ``s = 2 ** ceil(log2(amax / qmax))``, so
    rescaling is a bit shift (integer-only hardware); costs up to 1 bit of resolution."""

    FLOAT = "float"
    POW2 = "pow2"


@dataclass(frozen=True)
class IntFormat:
    """A fixed-width integer code format.

    ``bits`` in [2, 16]. Signed symmetric: codes in ``[-(2**(b-1) - 1), 2**(b-1) - 1]`` (e.g. int8:
    [-127, 127]; the code -128 is left out so that negation never overflows and zero is exact).
    Signed asymmetric (``symmetric=False``): ``[-2**(b-1), 2**(b-1) - 1]``. Unsigned: ``[0, 2**b - 1]``.
    Codes of up to 8 bits are stored in int8 (uint8 for unsigned 8-bit), up to 16 bits in int16.

    >>> IntFormat(8).qmax, IntFormat(8).qmin
    (127, -127)
    """

    bits: int = 8
    signed: bool = True
    symmetric: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.bits, int) or isinstance(self.bits, bool):
            raise UnsupportedFormatError(f"bits must be an int in [{MIN_BITS}, {MAX_BITS}], got {self.bits!r}")
        if not MIN_BITS <= self.bits <= MAX_BITS:
            raise UnsupportedFormatError(
                f"unsupported bit width {self.bits}: inttrain supports {MIN_BITS} to {MAX_BITS} bits"
            )
        if not self.signed and self.symmetric:
            # "symmetric" only has meaning for signed codes; normalise so equal formats compare equal.
            object.__setattr__(self, "symmetric", False)

    @property
    def qmax(self) -> int:
        return (1 << self.bits) - 1 if not self.signed else (1 << (self.bits - 1)) - 1

    @property
    def qmin(self) -> int:
        if not self.signed:
            return 0
        return -self.qmax if self.symmetric else -(1 << (self.bits - 1))

    @property
    def storage_bits(self) -> int:
        """Width of the storage integer: 8 for codes of up to 8 bits, else 16."""
        return 8 if self.bits <= 8 else 16

    def __str__(self) -> str:
        kind = "int" if self.signed else "uint"
        return f"{kind}{self.bits}" + ("" if self.symmetric or not self.signed else "a")


@dataclass(frozen=True)
class PerTensor:
    """One scale for the whole tensor."""

    def __str__(self) -> str:
        return "tensor"


@dataclass(frozen=True)
class PerChannel:
    """One scale per index along ``axis`` (the amax is taken over every other axis).

    For a 2-D matrix ``PerChannel(0)`` is per row and ``PerChannel(1)`` per column.
    """

    axis: int = 0

    def __str__(self) -> str:
        return f"channel(axis={self.axis})"


@dataclass(frozen=True)
class PerBlock:
    """One scale per contiguous block of ``size`` elements along ``axis`` (the last axis by default).

    The axis length must be a multiple of ``size``.
    """

    size: int = 32
    axis: int = -1

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise UnsupportedFormatError(f"block size must be a positive int, got {self.size!r}")

    def __str__(self) -> str:
        return f"block({self.size}, axis={self.axis})"


Granularity = Union[PerTensor, PerChannel, PerBlock]
PER_TENSOR = PerTensor()
PER_ROW = PerChannel(0)
PER_COLUMN = PerChannel(1)


@dataclass(frozen=True)
class QuantSpec:
    """Everything needed to quantize one tensor: format, granularity, rounding, scale kind."""

    fmt: IntFormat = IntFormat(8)
    granularity: Granularity = PER_TENSOR
    rounding: Rounding = Rounding.NEAREST_EVEN
    scale_kind: ScaleKind = ScaleKind.FLOAT
    overflow: Overflow = Overflow.SATURATE
    #: If set, the range is this fixed value instead of the data's amax (``s = fixed_amax / qmax``; values
    #: beyond it saturate).  Recipes whose transforms put values on a known grid (DoReFa's [0, 1] codes) use it.
    fixed_amax: float | None = None

    def __post_init__(self) -> None:
        if self.fixed_amax is not None and not (isinstance(self.fixed_amax, (int, float)) and 0 < self.fixed_amax < float("inf")):
            raise UnsupportedFormatError(f"fixed_amax must be a positive finite number or None, got {self.fixed_amax!r}")
        if not isinstance(self.fmt, IntFormat):
            raise UnsupportedFormatError(f"fmt must be an IntFormat, got {self.fmt!r}")
        if not isinstance(self.rounding, Rounding):
            raise UnsupportedFormatError(f"rounding must be a Rounding enum, got {self.rounding!r}")

    @property
    def bits(self) -> int:
        return self.fmt.bits

    def __str__(self) -> str:
        r = {Rounding.NEAREST_EVEN: "rne", Rounding.STOCHASTIC: "sr", Rounding.FLOOR: "floor"}[self.rounding]
        p2 = ",pow2" if self.scale_kind is ScaleKind.POW2 else ""
        fixed = "" if self.fixed_amax is None else f",amax={self.fixed_amax:g}"
        return f"{self.fmt}/{self.granularity}/{r}{p2}{fixed}"
