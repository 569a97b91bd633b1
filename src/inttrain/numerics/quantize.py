"""Quantize and dequantize torch tensors: scale choice, rounding, saturation.

The functions here define inttrain's quantization semantics.  They are plain eager torch code with
no data-dependent Python branches, so the kernels layer can hand the very same functions to
``torch.compile`` to fuse them into one pass (compiled and eager agree bit for bit for
round-to-nearest, which a test asserts).

Math (symmetric, per scale group ``G``):
    ``amax_G = max_{i in G} |x_i|``,  ``s_G = amax_G / qmax`` (or the next power of two),
    ``q_i = clamp(R(x_i / s_G), qmin, qmax)``  with ``R`` the rounding mode;  ``x_i ~= s_G q_i``.
    A group whose amax is 0 gets ``s = 1`` and codes 0 (never a NaN scale).
Inputs in float16/bfloat16/float64 are converted to float32 first (8-16 bit codes never need more).
Non-finite inputs raise :class:`NonFiniteError`: an inf or NaN never becomes a scale.
"""

from __future__ import annotations

import torch

from ..spec import IntFormat, PerBlock, PerChannel, PerTensor, QuantSpec, Rounding, ScaleKind, UnsupportedFormatError
from .hashing import uniform_from_counter
from .qtensor import QTensor

__all__ = [
    "NonFiniteError",
    "storage_dtype",
    "absmax",
    "scale_from_amax",
    "round_and_clamp",
    "check_finite",
    "is_finite",
    "quantize",
    "dequantize",
    "fake_quantize",
]


class NonFiniteError(ValueError):
    """Raised when a tensor to be quantized holds inf or NaN."""


def storage_dtype(fmt: IntFormat) -> torch.dtype:
    """The smallest torch integer dtype holding every code of ``fmt``."""
    if fmt.qmin >= -128 and fmt.qmax <= 127:
        return torch.int8
    if fmt.qmin >= 0 and fmt.qmax <= 255:
        return torch.uint8
    if fmt.qmin >= -32768 and fmt.qmax <= 32767:
        return torch.int16
    return torch.int32


def _axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise UnsupportedFormatError(f"granularity axis {axis} is out of range for a {ndim}-D tensor")
    return axis % ndim


def absmax(x: torch.Tensor, granularity) -> torch.Tensor:
    """Per-group max |x|, shaped to broadcast against ``x`` (against the blocked view for PerBlock)."""
    if isinstance(granularity, PerTensor):
        return x.abs().amax().reshape([1] * x.dim()) if x.numel() else x.new_zeros([1] * x.dim())
    if isinstance(granularity, PerChannel):
        ax = _axis(granularity.axis, x.dim())
        dims = [d for d in range(x.dim()) if d != ax]
        if x.numel() == 0:
            shape = [1] * x.dim()
            shape[ax] = x.shape[ax]
            return x.new_zeros(shape)
        return x.abs().amax(dim=dims, keepdim=True) if dims else x.abs()
    if isinstance(granularity, PerBlock):
        blocked = _blocked_view(x, granularity)
        ax = _axis(granularity.axis, x.dim())
        return blocked.abs().amax(dim=ax + 1, keepdim=True)
    raise UnsupportedFormatError(f"unknown granularity {granularity!r}")


def _blocked_view(x: torch.Tensor, g: PerBlock) -> torch.Tensor:
    ax = _axis(g.axis, x.dim())
    n = x.shape[ax]
    if n % g.size:
        raise UnsupportedFormatError(f"axis {g.axis} has length {n}, not a multiple of the block size {g.size}")
    return x.reshape(*x.shape[:ax], n // g.size, g.size, *x.shape[ax + 1 :])


def is_finite(amax: torch.Tensor) -> bool:
    """Whether every per-group amax (or scale) is finite: NaN/inf anywhere in a group shows up here.

    Inside a compiled graph this reads no data (always True): a non-finite scale then propagates as NaN
    through the dequantized results instead, which the trainer's non-finite step guard catches.
    """
    if torch.compiler.is_compiling():
        return True
    return bool(torch.isfinite(amax).all())


def check_finite(amax: torch.Tensor, what: str = "tensor") -> None:
    """Raise NonFiniteError if any amax is inf/NaN (one cheap check on the reduced values).

    Compiled graphs skip the check (see :func:`is_finite`): the NaN reaches the loss instead.
    """
    if not is_finite(amax):
        raise NonFiniteError(f"cannot quantize {what}: it contains inf or NaN values")


def scale_from_amax(amax: torch.Tensor, fmt: IntFormat, scale_kind: ScaleKind = ScaleKind.FLOAT) -> torch.Tensor:
    """``s = amax / qmax`` (or the next power of two above it); groups with amax == 0 get s = 1."""
    amax = amax.to(torch.float32)
    s = amax / fmt.qmax
    if scale_kind is ScaleKind.POW2:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    # amax == 0 -> s = 1 (codes 0); a NaN or inf amax stays non-finite so check_finite catches it.
    return torch.where(amax == 0, torch.ones_like(s), s)


def round_and_clamp(
    v: torch.Tensor, fmt: IntFormat, rounding: Rounding, seed: int | torch.Tensor = 0
) -> torch.Tensor:
    """Apply the rounding mode to real-valued codes ``v`` and saturate to the format's range (float out)."""
    if rounding is Rounding.NEAREST_EVEN:
        r = torch.round(v)
    elif rounding is Rounding.FLOOR:
        r = torch.floor(v)
    elif rounding is Rounding.STOCHASTIC:
        r = torch.floor(v + uniform_from_counter(v.shape, seed, v.device))
    else:  # pragma: no cover - the enum is closed
        raise UnsupportedFormatError(f"unknown rounding {rounding!r}")
    return r.clamp(fmt.qmin, fmt.qmax)


def _seed_from(seed: int | None, generator: torch.Generator | None) -> int:
    if seed is not None:
        return int(seed)
    if generator is not None:
        return int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    raise ValueError("stochastic rounding needs an explicit seed or torch.Generator (randomness is never implicit)")


def quantize(
    x: torch.Tensor,
    spec: QuantSpec = QuantSpec(),
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> QTensor:
    """Quantize ``x`` to integer codes with ``spec``; returns a :class:`QTensor`.

    >>> q = quantize(torch.tensor([0.5, -1.0, 0.25]))   # int8, per tensor, round to nearest even
    >>> q.data.tolist(), float(q.scale.flatten()[0]) == 1.0 / 127
    ([64, -127, 32], True)
    """
    if not x.is_floating_point():
        raise TypeError(f"quantize expects a floating-point tensor, got {x.dtype}")
    x = x.to(torch.float32)
    fmt = spec.fmt
    rounding_seed = _seed_from(seed, generator) if spec.rounding is Rounding.STOCHASTIC else 0
    amax = absmax(x, spec.granularity)
    check_finite(amax)
    if spec.fixed_amax is not None:
        amax = torch.full_like(amax, spec.fixed_amax)
    scale = scale_from_amax(amax, fmt, spec.scale_kind)
    if isinstance(spec.granularity, PerBlock):
        v = _blocked_view(x, spec.granularity) / scale
        codes = round_and_clamp(v, fmt, spec.rounding, rounding_seed).reshape(x.shape)
    else:
        codes = round_and_clamp(x / scale, fmt, spec.rounding, rounding_seed)
    return QTensor(codes.to(storage_dtype(fmt)), scale, spec)


def dequantize(q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``codes * scale`` as ``dtype`` (float32 by default)."""
    if isinstance(q.spec.granularity, PerBlock):
        blocked = _blocked_view(q.data.to(torch.float32), q.spec.granularity)
        return (blocked * q.scale).reshape(q.data.shape).to(dtype)
    return q.dequantize(dtype)


def fake_quantize(x: torch.Tensor, spec: QuantSpec = QuantSpec(), *, seed: int | None = None) -> torch.Tensor:
    """``dequantize(quantize(x))`` in ``x``'s dtype: the float *simulation* of a format, for analysis only."""
    return dequantize(quantize(x, spec, seed=seed), x.dtype)
