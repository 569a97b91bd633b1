"""The elementwise passes around the integer GEMMs: quantize a matrix, and the dequantizing epilogue.

Eager torch runs each of these as 4-6 memory passes and allocations, which eat most of the int8 GEMM
gain at small and medium shapes (measured here: 98 ms eager vs 7 ms compiled to row-quantize a
4096x4096 matrix).  The same functions are therefore handed to ``torch.compile`` (dynamic shapes,
so one compilation serves every batch size), which fuses each into a single pass.  If compilation
is unavailable or disabled (``INTTRAIN_COMPILE=0``) the eager versions run; both give the same
codes bit for bit for round-to-nearest (tested).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import types
from typing import Callable

import torch

from ..numerics.quantize import round_and_clamp, scale_from_amax, storage_dtype
from ..spec import PerChannel, PerTensor, QuantSpec, UnsupportedFormatError

__all__ = ["quantize_matrix", "matrix_scale", "channel_amax", "dequant_epilogue", "compile_enabled", "run_fused"]

log = logging.getLogger(__name__)


class _Fusion:
    """Owner of the process-wide fusion state: the decision "compile the quantize passes" (the user's
    INTTRAIN_COMPILE, read, never written, and whether a compilation has already failed on this machine) and
    the compiled specialisations made so far.  :meth:`clear` forgets both (the next call compiles afresh)."""

    def __init__(self) -> None:
        self.failed = False
        self._compiled: dict[tuple[Callable, tuple], Callable] = {}  # (fn, sorted constants) -> compiled
        self._made = itertools.count()  # never reset: every clone gets a code-object name of its own

    def enabled(self) -> bool:
        return not self.failed and os.environ.get("INTTRAIN_COMPILE", "1") not in ("0", "false", "no")

    def compiled(self, fn: Callable, constants: dict) -> Callable:
        """``fn`` with its non-tensor (keyword) arguments fixed, compiled once per distinct ``constants``.

        Each specialisation gets its own code object: dynamo keeps one guard cache per code object with
        a small recompile limit, and a model easily has more than 8 (spec, axis, layout) combinations.
        """
        key = (fn, tuple(sorted(constants.items())))
        run = self._compiled.get(key)
        if run is None:
            code = fn.__code__.replace(co_name=f"{fn.__name__}_{next(self._made)}")
            clone = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
            compiled = torch.compile(clone, dynamic=True)
            run = self._compiled[key] = lambda **tensors: compiled(**tensors, **constants)
        return run

    def clear(self) -> None:
        """Drop the compiled specialisations and the "compilation failed" mark."""
        self._compiled.clear()
        self.failed = False


FUSION = _Fusion()


def compile_enabled() -> bool:
    """Fusion with torch.compile is on unless INTTRAIN_COMPILE=0 (or compilation failed once here)."""
    return FUSION.enabled()


def _row_groups(rows: int) -> int:
    # Inductor's CPU loops run a reduction in parallel over its kept axis only: reducing a tall [rows, C] matrix
    # with C <= 16 down its rows is one thread's work (measured: a dataflow BatchNorm's statistics, 3.3 ms per
    # 128x16x32x32 call at either thread count).  Reducing [groups, rows / groups, C] over its middle axis first
    # gives that loop `groups` iterations to share out.
    return math.gcd(rows, 64) if rows else 1  # no rows: one empty group, as sum(0) / amax(0) see it


def column_amax(x: torch.Tensor) -> torch.Tensor:
    """``x.amax(0, keepdim=True)`` of a 2-D tensor, in row groups that compiled code reduces in parallel."""
    groups = _row_groups(x.shape[0])
    return x.reshape(groups, -1, x.shape[1]).amax(1).amax(0, keepdim=True)


def column_sum(x: torch.Tensor) -> torch.Tensor:
    """``x.sum(0)`` of a 2-D tensor, in row groups that compiled code reduces in parallel (the summation
    order differs from ``sum(0)``'s: the last bits may too)."""
    groups = _row_groups(x.shape[0])
    return x.reshape(groups, -1, x.shape[1]).sum(1).sum(0)


def _channel_amax_impl(x: torch.Tensor) -> torch.Tensor:
    return column_amax(x.to(torch.float32).abs())


def _matrix_scale_impl(x: torch.Tensor, spec: QuantSpec, kept_axis: int,
                       column_amax_of_x: torch.Tensor | None = None) -> torch.Tensor:
    x = x.to(torch.float32)
    if column_amax_of_x is not None:  # x's [1, C] column amax, already reduced (see channel_amax)
        per_channel = isinstance(spec.granularity, PerChannel)
        amax = column_amax_of_x if per_channel else column_amax_of_x.amax().reshape(1, 1)
    elif isinstance(spec.granularity, PerChannel):  # one scale per column (kept_axis 1) or per row (0)
        amax = column_amax(x.abs()) if kept_axis == 1 else x.abs().amax(dim=1, keepdim=True)
    else:
        amax = x.abs().amax().reshape(1, 1)
    if spec.fixed_amax is not None:
        amax = torch.full_like(amax, spec.fixed_amax)
    return scale_from_amax(amax, spec.fmt, spec.scale_kind)


def _quantize_matrix_impl(
    x: torch.Tensor, seed: torch.Tensor, spec: QuantSpec, kept_axis: int, transpose: bool, zero_point: int,
    column_amax_of_x: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.to(torch.float32)
    scale = _matrix_scale_impl(x, spec, kept_axis, column_amax_of_x)
    codes = round_and_clamp(x / scale, spec.fmt, spec.rounding, seed)
    dtype = storage_dtype(spec.fmt) if zero_point == 0 else torch.uint8
    codes = (codes + zero_point).to(dtype)
    if transpose:
        return codes.t().contiguous(), scale.t()
    return codes, scale


def _epilogue_impl(acc: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = acc.to(torch.float32) * sa * sb
    return y if bias is None else y + bias


def run_fused(fn: Callable, tensors: dict, constants: dict):
    """``fn(**tensors, **constants)``, compiled once per distinct ``constants`` where fusion is on."""
    if compile_enabled() and not torch.compiler.is_compiling():
        try:
            return FUSION.compiled(fn, constants)(**tensors)
        except Exception as exc:  # a missing C++ compiler, an unsupported platform...
            log.warning("torch.compile failed (%s); inttrain falls back to eager quantize passes", exc)
            FUSION.failed = True
    return fn(**tensors, **constants)


def quantize_matrix(
    x: torch.Tensor,
    spec: QuantSpec,
    kept_axis: int,
    *,
    transpose: bool = False,
    seed: int | torch.Tensor = 0,
    zero_point: int = 0,
    column_amax_of_x: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D matrix for use as a GEMM operand; returns ``(codes, scale)``.

    ``kept_axis`` is the operand's non-reduced axis (0 for a GEMM's lhs, 1 for its rhs):
    ``PerChannel`` granularity gives one scale per index of that axis, so the scale factors out of
    the integer sum; ``PerTensor`` gives one scale. ``transpose=True`` writes the codes transposed
    and contiguous (the layout ``torch._int_mm`` runs fastest on) and transposes the scale to match.
    ``zero_point=128`` emits ``code + 128`` as uint8 (the activation layout of oneDNN's int8 conv).
    The scale is returned un-checked: callers run :func:`inttrain.numerics.check_finite` on it.
    ``column_amax_of_x``: :func:`channel_amax` of ``x`` when the caller has it (``kept_axis=1``): the scale
    comes from it (its maximum for ``PerTensor``) instead of another pass over ``x``.
    """
    if x.dim() != 2:
        raise ValueError(f"quantize_matrix expects a 2-D tensor, got shape {tuple(x.shape)}")
    if not isinstance(spec.granularity, (PerTensor, PerChannel)):
        raise UnsupportedFormatError(f"GEMM operands support PerTensor or PerChannel granularity, not {spec.granularity}")
    if x.numel() == 0:
        shape = list(x.shape)
        scale_shape = [1, 1]
        if isinstance(spec.granularity, PerChannel):
            scale_shape[kept_axis] = x.shape[kept_axis]
        dtype = storage_dtype(spec.fmt) if zero_point == 0 else torch.uint8
        codes = torch.full(shape[::-1] if transpose else shape, zero_point, dtype=dtype, device=x.device)
        scale = torch.ones(scale_shape, device=x.device)
        return codes, scale.t() if transpose else scale
    if isinstance(seed, torch.Tensor):  # a compiled step's per-call seed (see IntLayerMixin._next_seeds)
        seed_t = (seed & 0xFFFFFFFF).to(x.device)
    else:
        seed_t = torch.tensor(seed & 0xFFFFFFFF, dtype=torch.int64, device=x.device)
    # detach(): dynamo specialises on nn.Parameter shapes (a recompile per layer shape); a plain tensor is dynamic.
    tensors = {"x": x.detach(), "seed": seed_t}
    if column_amax_of_x is not None:
        _check_column_amax(column_amax_of_x, x, kept_axis)
        tensors["column_amax_of_x"] = column_amax_of_x
    return run_fused(_quantize_matrix_impl, tensors,
                {"spec": spec, "kept_axis": kept_axis, "transpose": transpose, "zero_point": zero_point})


def _check_column_amax(column_amax_of_x: torch.Tensor, x: torch.Tensor, kept_axis: int) -> None:
    if kept_axis != 1 or tuple(column_amax_of_x.shape) != (1, x.shape[1]):
        raise ValueError(f"column_amax_of_x must be [1, {x.shape[1]}] with kept_axis 1, got "
                         f"{tuple(column_amax_of_x.shape)} with kept_axis {kept_axis}")


def channel_amax(x: torch.Tensor) -> torch.Tensor:
    """``|x|.amax(0, keepdim=True)`` ([1, C]) of a non-empty 2-D matrix in one pass: what both a per-channel and a
    per-tensor scale of ``x`` (``kept_axis=1``) derive from, so two quantizers of one tensor read it once."""
    if x.dim() != 2 or x.numel() == 0:
        raise ValueError(f"channel_amax expects a non-empty 2-D tensor, got shape {tuple(x.shape)}")
    return run_fused(_channel_amax_impl, {"x": x.detach()}, {})


def matrix_scale(x: torch.Tensor, spec: QuantSpec, kept_axis: int,
                 column_amax_of_x: torch.Tensor | None = None) -> torch.Tensor:
    """The scale :func:`quantize_matrix` would use for ``x`` ([1, C] or [1, 1] for ``kept_axis=1``), alone: for
    a kernel that makes the codes itself.  Un-checked, as there; ``column_amax_of_x`` as there."""
    if x.dim() != 2 or x.numel() == 0:
        raise ValueError(f"matrix_scale expects a non-empty 2-D tensor, got shape {tuple(x.shape)}")
    if not isinstance(spec.granularity, (PerTensor, PerChannel)):
        raise UnsupportedFormatError(f"GEMM operands support PerTensor or PerChannel granularity, not {spec.granularity}")
    tensors = {"x": x.detach()}
    if column_amax_of_x is not None:
        _check_column_amax(column_amax_of_x, x, kept_axis)
        tensors["column_amax_of_x"] = column_amax_of_x
    return run_fused(_matrix_scale_impl, tensors, {"spec": spec, "kept_axis": kept_axis})


def dequant_epilogue(
    acc: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``acc * sa * sb (+ bias)`` in float32, one fused pass over the integer accumulator."""
    if acc.numel() == 0:
        return _epilogue_impl(acc, sa, sb, bias)
    if bias is None:
        return run_fused(_epilogue_impl, {"acc": acc, "sa": sa, "sb": sb}, {"bias": None})
    return run_fused(_epilogue_impl, {"acc": acc, "sa": sa, "sb": sb, "bias": bias}, {})


