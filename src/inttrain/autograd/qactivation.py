"""``QActivation``: an int8 activation that flows between layers, through autograd, with its scale.

Without it every integer layer re-quantizes its float input and every float op (BatchNorm, ReLU,
the residual add) keeps its float input alive for backward, so a training step holds as much
activation memory as fp32.  A ``QActivation`` is a tensor subclass whose *value* is
``scale * (codes - zero_point)``: autograd sees an ordinary float32 tensor of that shape (so
gradients reaching it are plain float tensors, summed by autograd as usual), but the storage is
the int8 codes and a per-tensor or per-channel scale.

* Ops with an int8 version (ReLU/ReLU6, max/avg/adaptive-avg pooling, flatten, dropout, batch norm,
  the residual add; :mod:`inttrain.autograd.dataflow`) are intercepted in ``__torch_function__``, run
  on the codes, save int8 codes for backward, and return a ``QActivation`` again.
* Integer conv layers take the codes as their GEMM operand directly (no quantize pass) and, with
  dataflow on, return their output as a ``QActivation``.
* Any other op falls back to float: ``__torch_dispatch__`` hands it the dequantized values (exactly
  the values the int8 tensor stands for) and logs the op once.  Autograd still saves the
  ``QActivation`` itself where the op's backward needs its input, so even a fallback op keeps int8.

Codes are stored as ``uint8 = int8 + 128`` (``zero_point=128``) in channels-last memory for 4-D
tensors: the layout oneDNN's int8 convolution reads, so a conv consumes them without a copy.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

from ..spec import IntFormat, PerChannel, PerTensor, QuantSpec

__all__ = ["QActivation", "DeferredQuant", "quantize_activation", "dequantize_if_quantized", "fallback_ops_seen", "to_float"]

log = logging.getLogger("inttrain")

#: torch function -> int8 implementation; filled by :mod:`inttrain.autograd.dataflow` when it is imported (the
#: ``inttrain.autograd`` package imports it, so the tables are full before any QActivation exists).
INT8_OPS: dict[Callable, Callable] = {}
#: the same for a DeferredQuant input (ReLU and the residual add: they quantize their own output).
DEFERRED_OPS: dict[Callable, Callable] = {}


class _FallbackLog:
    """Owner of the names of the aten ops that ran in float on a QActivation in this process: each is logged
    once, and :func:`fallback_ops_seen` reports them.  :meth:`clear` forgets them (each is logged again)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def note(self, name: str) -> None:
        if name not in self._seen:
            self._seen.add(name)
            log.info("inttrain dataflow: %s has no int8 version; it runs in float on the dequantized values", name)

    def seen(self) -> set[str]:
        return set(self._seen)

    def clear(self) -> None:
        self._seen.clear()


FALLBACKS = _FallbackLog()
_CL = torch.channels_last


def output_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype an integer layer returns for the float input ``x``: the autocast dtype where autocast is on for
    ``x``'s device -- under ``torch.autocast("cpu", dtype=torch.bfloat16)`` the activations between layers stay in
    bfloat16, as in float layers under autocast (half the bytes for every elementwise pass around the integer
    GEMMs, whose codes and int32 sums do not depend on it) -- else ``x``'s own dtype."""
    device = x.device.type
    if x.is_floating_point() and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def rows_view(t: torch.Tensor) -> torch.Tensor | None:
    """The ``[rows, C]`` matrix view of a contiguous 2-D tensor or a channels-last 4-D tensor (None otherwise)."""
    if t.dim() == 2 and t.is_contiguous():
        return t
    if t.dim() == 4 and t.is_contiguous(memory_format=_CL):
        return t.permute(0, 2, 3, 1).reshape(-1, t.shape[1])
    return None


def from_rows(r: torch.Tensor, shape) -> torch.Tensor:
    """Inverse of :func:`rows_view`: the NCHW (channels-last) or 2-D tensor of ``shape``."""
    if len(shape) == 4:
        n, c, h, w = shape
        return r.reshape(n, h, w, c).permute(0, 3, 1, 2)
    return r.reshape(shape)


def quantize_rows_of(x: torch.Tensor, spec, seed: int = 0, zero_point: int = 0,
                     column_amax: torch.Tensor | None = None):
    """Quantize a 2-D or NCHW tensor through its ``[rows, C]`` view (channels-last for 4-D); ``spec``'s
    PerChannel gives one scale per channel C.  Returns ``(codes shaped like x, scale)``.  ``column_amax``: the
    view's :func:`~inttrain.kernels.fused.channel_amax`, when the caller has it (one pass less)."""
    from ..kernels.fused import quantize_matrix

    if x.dim() == 4:
        x = x.contiguous(memory_format=_CL)
    elif x.dim() == 2:
        x = x.contiguous()
    codes, scale = quantize_matrix(rows_view(x), spec, 1, seed=seed, zero_point=zero_point,
                                   column_amax_of_x=column_amax)
    return from_rows(codes, x.shape), scale


class QActivation(torch.Tensor):
    """A float32-valued tensor stored as int codes: ``value = scale * (codes - zero_point)``.

    Attributes:
        codes: uint8 (``zero_point=128``) or int8 (``zero_point=0``) tensor of the full shape.
        scale: float32, shape ``[1]`` (per tensor) or ``[C]`` (per channel along dim 1).
        zero_point: 0 or 128.
        bits: the signed bit width the codes were quantized to (2..8).
    """

    codes: torch.Tensor
    scale: torch.Tensor
    zero_point: int
    bits: int

    @staticmethod
    def __new__(cls, codes: torch.Tensor, scale: torch.Tensor, zero_point: int = 128, bits: int = 8):
        if codes.dtype not in (torch.int8, torch.uint8):
            raise TypeError(f"QActivation codes must be int8 or uint8, got {codes.dtype}")
        if (zero_point == 128) != (codes.dtype == torch.uint8):
            raise ValueError("QActivation: uint8 codes go with zero_point 128, int8 codes with zero_point 0")
        scale = scale.reshape(-1).to(torch.float32)
        if scale.numel() != 1 and (codes.dim() < 2 or scale.numel() != codes.shape[1]):
            raise ValueError(f"QActivation scale must have 1 or C={codes.shape[1] if codes.dim() > 1 else '?'}"
                             f" elements, got {scale.numel()}")
        t = torch.Tensor._make_wrapper_subclass(
            cls, codes.shape, strides=codes.stride(), dtype=torch.float32, device=codes.device, requires_grad=False
        )
        t.codes, t.scale, t.zero_point, t.bits = codes, scale, zero_point, bits
        return t

    # -- views of the data ------------------------------------------------------------------------
    @property
    def per_channel(self) -> bool:
        return self.scale.numel() > 1

    def scale_view(self) -> torch.Tensor:
        """The scale shaped to broadcast against the codes."""
        if not self.per_channel:
            return self.scale
        return self.scale.reshape(1, -1, *([1] * (self.codes.dim() - 2)))

    def int_codes(self) -> torch.Tensor:
        """Signed int8 codes (a bit flip of uint8 storage; the same tensor for int8 storage)."""
        if self.zero_point == 0:
            return self.codes
        return torch.bitwise_xor(self.codes, 128).view(torch.int8)

    def dequantize(self) -> torch.Tensor:
        """The float32 values this tensor stands for (exact: codes times scale)."""
        c = self.codes
        if self.zero_point == 128:
            from ..kernels.dataflow_passes import dequantize_rows  # one fused pass over a [rows, C] view

            rows = rows_view(c)
            if rows is not None:
                return from_rows(dequantize_rows(rows, self.scale), c.shape)
            if c.dim() > 2 and c.is_contiguous() and not self.per_channel:
                return dequantize_rows(c.reshape(-1, c.shape[-1]), self.scale).reshape(c.shape)
        codes = self.codes.to(torch.float32)
        if self.zero_point:
            codes = codes - self.zero_point
        return codes * self.scale_view()

    def nbytes_stored(self) -> int:
        return self.codes.numel() * self.codes.element_size() + self.scale.numel() * 4

    def __repr__(self) -> str:  # never print the codes by accident of a float repr
        kind = "per-channel" if self.per_channel else "per-tensor"
        return f"QActivation(shape={tuple(self.shape)}, int{self.bits} {kind}, grad_fn={self.grad_fn})"

    def __tensor_flatten__(self):
        return ["codes", "scale"], (self.zero_point, self.bits)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return QActivation(inner["codes"], inner["scale"], *meta)

    # -- routing ----------------------------------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _route(INT8_OPS, func, args, kwargs or {})

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            (x,) = args
            return QActivation(x.codes, x.scale, x.zero_point, x.bits)
        FALLBACKS.note(str(func))
        unwrap = lambda a: a.dequantize() if isinstance(a, QActivation) else a  # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


class DeferredQuant(torch.Tensor):
    """A float tensor whose int8 quantization is left to the op that consumes it.

    A dataflow convolution hands its output on as a ``DeferredQuant`` (batch norm normalises the exact
    values and saves int8 codes of them for backward), and batch norm hands on its own: it is usually
    followed by a ReLU, and a symmetric int8 grid chosen *before* the ReLU spends up to half of its codes
    on negative values the ReLU then zeroes.  ReLU and the residual add consume it and quantize their own
    output (so nothing float is ever saved for backward); any other consumer sees a plain float tensor
    (an integer layer quantizes it as usual).  ``relu_amax`` (``[1]``), when the producer knows
    ``max(relu(inner))`` without another pass over it (batch norm does), spares the ReLU its amax pass.
    """

    inner: torch.Tensor
    bits: int
    relu_amax: torch.Tensor | None

    @staticmethod
    def __new__(cls, inner: torch.Tensor, bits: int = 8, relu_amax: torch.Tensor | None = None):
        # A wrapper around the float tensor (not a view of it): torch.compile traces wrapper subclasses
        # (flattened to ``inner``), while ``as_subclass`` on a traced tensor is refused.
        t = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), dtype=inner.dtype, device=inner.device, requires_grad=False
        )
        t.inner, t.bits, t.relu_amax = inner, bits, relu_amax
        return t

    def __repr__(self) -> str:
        return f"DeferredQuant(shape={tuple(self.shape)}, int{self.bits} pending, grad_fn={self.grad_fn})"

    def __tensor_flatten__(self):
        return (["inner"] if self.relu_amax is None else ["inner", "relu_amax"]), (self.bits,)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return DeferredQuant(inner["inner"], *meta, inner.get("relu_amax"))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _route(DEFERRED_OPS, func, args, kwargs or {})

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            (x,) = args
            return DeferredQuant(func(x.inner), x.bits, x.relu_amax)
        unwrap = lambda a: a.inner if isinstance(a, DeferredQuant) else a  # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


def _route(table: dict[Callable, Callable], func, args, kwargs):
    """Run ``func``'s dataflow version from ``table`` if it has one that accepts these arguments, else ``func``
    itself with subclass dispatch off (plain tensors out; a QActivation argument then reaches
    ``__torch_dispatch__``, which dequantizes it)."""
    impl = table.get(func)  # (the tables are filled when inttrain.autograd imports its dataflow module)
    if impl is not None:
        out = impl(*args, **kwargs)
        if out is not NotImplemented:
            return out
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def fallback_ops_seen() -> set[str]:
    """Names of the aten ops that ran in float on a QActivation so far in this process."""
    return FALLBACKS.seen()


def dequantize_if_quantized(x: Any) -> Any:
    """``x.dequantize()`` for a QActivation, ``x`` otherwise (keeps autograd: used at float boundaries)."""
    if isinstance(x, QActivation):
        return to_float(x)
    return x


class _ToFloat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: QActivation):
        return x.dequantize()

    @staticmethod
    def backward(ctx, g):
        return g


def to_float(x: QActivation) -> torch.Tensor:
    """The float values of ``x`` as a plain tensor, gradient passed through (a dataflow boundary)."""
    return _ToFloat.apply(x)


#: The specs :func:`quantize_activation` uses, made once: a compiled graph then reads a constant instead of building
#: the dataclasses while it traces (torch 2.11's Dynamo cannot build an IntFormat inside an autograd.Function).
_ACTIVATION_SPECS = {(bits, per_channel): QuantSpec(IntFormat(bits), PerChannel(axis=1) if per_channel else PerTensor())
                     for bits in range(2, 17) for per_channel in (False, True)}


def quantize_activation(x: torch.Tensor, per_channel: bool = False, bits: int = 8,
                        name: str = "activation") -> QActivation:
    """Quantize a float tensor (no autograd) to a QActivation: symmetric, round-half-even, absmax scale.

    4-D tensors are quantized through their channels-last ``[N*H*W, C]`` view; ``per_channel`` gives
    one scale per channel (dim 1).  A non-finite value raises NonFiniteError naming ``name``.
    """
    from ..kernels.fused import quantize_matrix
    from ..numerics.quantize import check_finite
    spec = _ACTIVATION_SPECS.get((bits, per_channel))
    if spec is None:  # outside 2..16 bits: IntFormat raises its own error
        spec = QuantSpec(IntFormat(bits), PerChannel(axis=1) if per_channel else PerTensor())
    x = x.detach()
    if x.dim() in (2, 4):
        codes, scale = quantize_rows_of(x, spec, zero_point=128)
    else:
        if per_channel:
            raise ValueError("per-channel QActivation needs a 2-D or 4-D tensor")
        codes, scale = quantize_matrix(x.reshape(1, -1), spec, 1, zero_point=128)
        codes = codes.reshape(x.shape)
    check_finite(scale, name)
    return QActivation(codes, scale.reshape(-1), 128, bits)
