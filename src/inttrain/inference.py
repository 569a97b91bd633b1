"""An int8 inference copy of a trained model: traceable by ``torch.export`` and ONNX, with the trained scales.

The training layers (:class:`~inttrain.nn.QLinear`, :class:`~inttrain.nn.QConv2d`, GPT-2's ``QConv1D``) run
custom autograd Functions and integer kernels, which neither exporter traces.  :func:`to_inference` copies
the model and puts in their place small float modules that do the forward GEMM's quantization with standard
quantize/dequantize operators (``torch.ops.quantized_decomposed``, exported to ONNX as
``QuantizeLinear``/``DequantizeLinear``, the "QDQ" format ONNX Runtime fuses into int8 kernels):

- the weight is stored as int8 codes + one float scale per output channel (the recipe's forward weight
  format: ``s = amax / qmax`` of the trained weight, round to nearest even), ``DequantizeLinear`` in the graph;
- the input is quantized at run time exactly as the recipe's forward GEMM does it: one scale per row (token)
  for Linear layers with per-row activations, one per tensor otherwise (``s = amax / qmax``; an all-zero group
  gets ``s = 1``).

Scales are ``amax / qmax`` or, where the recipe says so (wageubn), the next power of two above it.
Inference rounds to nearest even even where a recipe rounds the forward pass stochastically.  Layers whose
recipe transforms its operands at run time (DoReFa), whose codes are wider than 8 bits or whose range is
fixed are refused with a ``ValueError`` naming the layer: an export that
silently computed something else would be worse.  Layers whose forward GEMM is float stay float.

:func:`export_onnx` and :func:`export_torch` write such a model (batch dimension dynamic) and return the
written file loaded back, ready to check against the trained model (``inttrain export`` does exactly that).

>>> import torch, inttrain
>>> m = inttrain.prepare_(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))
>>> from inttrain.inference import to_inference
>>> type(to_inference(m)[0]).__name__
'Int8Linear'
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .nn import IntLayerMixin, QConv2d, restore_module
from .numerics import quantize
from .recipes import LayerHooks
from .spec import LayerPrecision, PerChannel, QuantSpec, Rounding, ScaleKind

__all__ = ["to_inference", "Int8Linear", "Int8Conv2d", "register_qdq_ops", "export_onnx", "export_torch",
           "onnx_translations", "quiet_exporter"]


def register_qdq_ops() -> None:
    """Register ``torch.ops.quantized_decomposed`` (needed to trace, export, and to load a saved .pt2)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import torch.ao.quantization.fx._decomposed  # noqa: F401


def _check_exportable(name: str, layer: IntLayerMixin) -> None:
    why = None
    if layer.hooks is not None and type(layer.hooks).forward_operands is not LayerHooks.forward_operands:
        # Hooks that only touch the gradient (unified-int8's clipping) do not change inference.
        why = f"its recipe transforms the operands at run time ({type(layer.hooks).__name__})"
    for side, spec in (("input", layer.precision.forward.lhs), ("weight", layer.precision.forward.rhs)):
        fmt = spec.fmt
        if why is None and (fmt.bits > 8 or not fmt.signed or not fmt.symmetric):
            why = f"its {side} codes are {fmt} (export writes signed symmetric codes of up to 8 bits)"
        if why is None and spec.fixed_amax is not None:
            why = f"its {side} has a fixed range (fixed_amax={spec.fixed_amax})"
    if why is not None:
        raise ValueError(f"layer {name or '<root>'} ({type(layer).__name__}) cannot be exported to int8: {why}")


def _weight_codes(module: nn.Module, weight: torch.Tensor, spec: QuantSpec) -> None:
    """int8 codes + per-output-channel scales of ``weight`` as buffers (a per-tensor scale is repeated)."""
    kind = spec.scale_kind
    q = quantize(weight.detach().float(), QuantSpec(spec.fmt, PerChannel(0), Rounding.NEAREST_EVEN, kind))
    module.register_buffer("weight_codes", q.data.to(torch.int8))
    module.register_buffer("weight_scale", q.scale.reshape(-1).contiguous())
    module.qmax = spec.fmt.qmax
    if not isinstance(spec.granularity, PerChannel):  # one scale for the whole weight, as the recipe has it
        q = quantize(weight.detach().float(), QuantSpec(spec.fmt, spec.granularity, Rounding.NEAREST_EVEN, kind))
        module.weight_codes.copy_(q.data.to(torch.int8))
        module.weight_scale.copy_(q.scale.reshape(1).expand(weight.shape[0]))


class _Int8Base(nn.Module):
    weight_codes: torch.Tensor
    weight_scale: torch.Tensor
    qmax: int
    pow2: bool  # input scale rounded up to a power of two (wageubn), as in numerics.scale_from_amax
    bias: torch.Tensor | None

    def _scale(self, amax: torch.Tensor) -> torch.Tensor:
        s = amax / self.qmax
        if self.pow2:
            s = torch.exp2(torch.ceil(torch.log2(s)))
        return torch.where(amax > 0, s, torch.ones_like(amax))  # an all-zero group: s = 1, codes 0

    def dequantized_weight(self) -> torch.Tensor:
        qd = torch.ops.quantized_decomposed
        zp = torch.zeros_like(self.weight_scale, dtype=torch.int64)
        return qd.dequantize_per_channel(self.weight_codes, self.weight_scale, zp, 0, -self.qmax, self.qmax, torch.int8)

    def qdq_per_tensor(self, x: torch.Tensor) -> torch.Tensor:
        qd = torch.ops.quantized_decomposed
        s = self._scale(x.abs().max())  # max() rather than amax(): the ONNX exporter needs a dim for amax
        zp = torch.zeros((), dtype=torch.int64)
        q = qd.quantize_per_tensor.tensor(x, s, zp, -self.qmax, self.qmax, torch.int8)
        return qd.dequantize_per_tensor.tensor(q, s, zp, -self.qmax, self.qmax, torch.int8)


class Int8Linear(_Int8Base):
    """``y = Q(x) W_q^T + b`` with int8 weight codes and run-time int8 input codes (per row or per tensor)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, precision: LayerPrecision) -> None:
        super().__init__()
        _weight_codes(self, weight, precision.forward.rhs)
        self.pow2 = precision.forward.lhs.scale_kind is ScaleKind.POW2
        self.per_row = isinstance(precision.forward.lhs.granularity, PerChannel)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.float().reshape(-1, shape[-1])
        if self.per_row:
            qd = torch.ops.quantized_decomposed
            s = self._scale(x2.abs().amax(dim=1))
            zp = torch.zeros_like(s, dtype=torch.int64)
            q = qd.quantize_per_channel(x2, s, zp, 0, -self.qmax, self.qmax, torch.int8)
            x2 = qd.dequantize_per_channel(q, s, zp, 0, -self.qmax, self.qmax, torch.int8)
        else:
            x2 = self.qdq_per_tensor(x2)
        y = F.linear(x2, self.dequantized_weight(), self.bias)
        return y.reshape(*shape[:-1], y.shape[-1])


class Int8Conv2d(_Int8Base):
    """``conv2d(Q(x), W_q) + b`` with int8 weight codes per output channel and a per-tensor int8 input."""

    def __init__(self, conv: nn.Conv2d, precision: LayerPrecision) -> None:
        super().__init__()
        _weight_codes(self, conv.weight, precision.forward.rhs)
        self.pow2 = precision.forward.lhs.scale_kind is ScaleKind.POW2
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach().float().clone(), requires_grad=False)
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(self.qdq_per_tensor(x.float()), self.dequantized_weight(), self.bias, self.stride,
                        self.padding, self.dilation, self.groups)


def _inference_layer(name: str, layer: IntLayerMixin) -> nn.Module:
    if not layer.precision.forward.integer:
        return restore_module(layer)  # a float forward GEMM: the plain layer is the inference layer
    _check_exportable(name, layer)
    if isinstance(layer, QConv2d):
        return Int8Conv2d(layer, layer.precision)
    weight = layer.weight if isinstance(layer, nn.Linear) else layer.weight.t()  # GPT-2 Conv1D: [in, out]
    return Int8Linear(weight, layer.bias, layer.precision)


def to_inference(model: nn.Module) -> nn.Module:
    """An eval-mode copy of ``model`` with every integer-training layer replaced by its int8 inference layer.

    ``model`` itself is not changed.  Raises ``ValueError`` for layers that cannot be exported (see module doc).
    """
    register_qdq_ops()
    out = copy.deepcopy(model).eval()
    if isinstance(out, IntLayerMixin):
        return _inference_layer("", out)
    for name, module in list(out.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, IntLayerMixin):
                full = f"{name}.{child_name}" if name else child_name
                setattr(module, child_name, _inference_layer(full, child))
    for p in out.parameters():
        p.requires_grad_(False)
    return out


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence the exporters' notes (optional libraries such as torchvision, pytree deprecations) on the
    console; errors still raise."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # pytree deprecation notes from inside torch.export
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def onnx_translations() -> dict:
    """ONNX translations the exporter lacks: per-tensor QDQ with a run-time scale (torchlib's wants the zero
    point as a constant) and a whole-tensor ``amax`` (torchlib's requires ``dim``; 8-bit BN uses it)."""
    import onnxscript
    from onnxscript import opset18 as op

    int8 = onnxscript.ir.DataType.INT8

    def quantize(x, scale, zero_point, quant_min: int, quant_max: int, dtype: int):
        return op.QuantizeLinear(x, scale, op.Cast(zero_point, to=int8))

    def dequantize(x, scale, zero_point, quant_min: int, quant_max: int, dtype: int, out_dtype: int = -1):
        return op.DequantizeLinear(x, scale, op.Cast(zero_point, to=int8))

    def amax(x, dim=(), keepdim: bool = False):  # torchlib requires dim; the whole-tensor amax (8-bit BN) has none
        keep = 1 if keepdim else 0
        if not dim:
            return op.ReduceMax(x, keepdims=keep)
        return op.ReduceMax(x, op.Constant(value_ints=list(dim)), keepdims=keep)

    qd = torch.ops.quantized_decomposed
    return {qd.quantize_per_tensor.tensor: quantize, qd.dequantize_per_tensor.tensor: dequantize,
            torch.ops.aten.amax.default: amax}


def export_onnx(model: nn.Module, example: torch.Tensor, path: str | Path) -> Callable[[torch.Tensor], torch.Tensor]:
    """Write ``model`` (e.g. :func:`to_inference`'s copy; one tensor input, batch dimension dynamic) as ONNX
    to ``path`` and return a function that runs the written file with ONNX Runtime (tensor in, tensor out).

    Needs onnx, onnxscript and onnxruntime (``pip install 'inttrain[onnx]'``).
    """
    import onnxruntime as ort

    dims = ({0: torch.export.Dim("batch")},)
    with quiet_exporter():
        program = torch.onnx.export(model, (example,), dynamic_shapes=dims, dynamo=True, verbose=False,
                                    custom_translation_table=onnx_translations())
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: torch.from_numpy(session.run(None, {name: x.numpy()})[0])


def export_torch(model: nn.Module, example: torch.Tensor, path: str | Path) -> Callable[[torch.Tensor], torch.Tensor]:
    """Write ``model`` as a ``torch.export`` program (``.pt2``, batch dimension dynamic) to ``path``; return
    the module loaded back from the file."""
    with quiet_exporter():
        program = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
        torch.export.save(program, str(path))
        return torch.export.load(str(path)).module()
