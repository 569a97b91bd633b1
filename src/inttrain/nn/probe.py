"""Numerics probe: per integer layer and per GEMM, the SQNR of the integer result against float64.

For one batch, :func:`probe_gemms` runs a forward and backward of a *copy* of the model (the model's
weights, buffers, stochastic-rounding counters and recipe state stay untouched) and records, at every
:class:`QLinear` / :class:`QConv2d`, the input ``x`` it received and the gradient ``dy`` of its output.
Each layer is then run again alone on exactly those tensors: its integer results

    forward       y  = x W^T (+ b)      the layer's output
    grad_input    dx = dy W             the gradient its backward returns for x (when x needs one)
    grad_weight   dW = dy^T x           the gradient it writes to its weight

are compared with the same three products computed in float64 from the same ``x``, ``W`` and ``dy``:
``SQNR = 10 log10(sum ref^2 / sum (int - ref)^2)`` dB (:func:`inttrain.numerics.sqnr_db`; ``inf`` when
equal). The reference multiplies the operands the layer's GEMMs are given: after the recipe's float
transforms of ``x`` and ``W`` (DoReFa's normalisation and k-bit quantizer are the model it trains, and
the gradients of both sides flow back through the same transform), but with the raw output gradient, so
a recipe's transform of ``dy`` (Unified INT8's clipping, DoReFa's gradient noise) counts as error, as
does the re-quantization of an int8 dataflow output: the figure says how far the layer's arithmetic is
from exact.

>>> rows = probe_gemms(model, x, y)       # doctest: +SKIP
>>> [(r.layer, r.gemm, round(r.sqnr_db, 1)) for r in rows][:3]
[('conv1', 'forward', 38.2), ('conv1', 'grad_weight', 31.0), ('layer1.0.conv1', 'forward', 36.9)]
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..autograd.qactivation import QActivation, dequantize_if_quantized
from ..numerics.metrics import sqnr_db
from .layers import QConv2d, QLinear

__all__ = ["GemmSqnr", "probe_gemms", "PROBE_GEMMS"]

PROBE_GEMMS: tuple[str, ...] = ("forward", "grad_input", "grad_weight")


@dataclass(frozen=True)
class GemmSqnr:
    """One GEMM of one layer: ``integer`` (False: the precision keeps it float), operand ``bits`` as ``lhs x rhs``."""

    layer: str
    kind: str  # "Linear" or "Conv2d"
    gemm: str
    integer: bool
    bits: str
    sqnr_db: float


def _value(t: Tensor) -> Tensor:
    """The float values of ``t`` (an int8 dataflow activation is dequantized)."""
    return t.dequantize() if isinstance(t, QActivation) else t


def default_loss(y: Tensor) -> Callable[[Tensor], Tensor]:
    """Cross-entropy against labels ``y`` (per token for ``[B, T, V]`` logits)."""

    def loss(out: Tensor) -> Tensor:
        out = _value(out).float()
        if out.ndim == 3:
            return F.cross_entropy(out.flatten(0, 1), y.flatten())
        return F.cross_entropy(out, y)

    return loss


def _float_gemms(layer: nn.Module, x: Tensor, dy: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(y, dx, dW) of the plain float64 product on the same operands."""
    xd = _value(x).detach().double().requires_grad_(True)
    wd = layer.weight.detach().double().requires_grad_(True)
    bd = None if layer.bias is None else layer.bias.detach().double()
    # The recipe's float transforms of the operands (DoReFa) belong to the model, not to its arithmetic.
    xt, wt = (xd, wd) if layer.hooks is None else layer.hooks.forward_operands(layer, xd, wd)
    if isinstance(layer, QConv2d):
        yd = F.conv2d(xt, wt, bd, layer.stride, layer.padding, layer.dilation, layer.groups)
    else:
        yd = F.linear(xt, wt, bd)
    yd.backward(dy.double())
    return yd.detach(), xd.grad, wd.grad


def _int_gemms(layer: nn.Module, x: Tensor, dy: Tensor, needs_dx: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    """(y, dx, dW) of the layer itself on the same operands (its integer kernels)."""
    xi = x.detach()
    if needs_dx:
        xi.requires_grad_(True)
    layer.weight.grad = None
    yi = dequantize_if_quantized(layer(xi))  # keeps autograd through an int8 dataflow output
    yi.backward(dy)
    return yi.detach(), xi.grad if needs_dx else None, layer.weight.grad


def probe_gemms(model: nn.Module, x: Tensor, y: Tensor | None = None,
                loss_fn: Callable[[Tensor], Tensor] | None = None) -> list[GemmSqnr]:
    """SQNR (dB) of every integer layer's forward, grad_input and grad_weight GEMM on batch ``x``.

    ``loss_fn(output) -> scalar`` gives the output gradients (default: cross-entropy against ``y``). The
    model runs in training mode on a deep copy (hooks of the original, e.g. a BitOPs counter, are not
    copied over), so calling this between training steps changes nothing about the run. Rows follow the
    model's module order; ``grad_input`` is absent for a layer whose input needs no gradient (the first).
    """
    if loss_fn is None:
        if y is None:
            raise ValueError("probe_gemms needs labels y or a loss_fn")
        loss_fn = default_loss(y)
    twin = copy.deepcopy(model)
    for m in twin.modules():  # another tool's hooks (counters) must not see the probe's passes
        m._forward_hooks.clear()
        m._forward_pre_hooks.clear()
        m._backward_hooks.clear()
        m._backward_pre_hooks.clear()
    twin.train()
    layers = [(n, m) for n, m in twin.named_modules() if isinstance(m, (QLinear, QConv2d))]
    seen_x: dict[str, Tensor] = {}
    seen_dy: dict[str, Tensor] = {}
    handles = []

    def capture(name: str):
        def pre(module: nn.Module, args: tuple) -> None:
            seen_x[name] = args[0].detach()
            seen_x[name + "/grad"] = torch.tensor(args[0].requires_grad)

        def post(module: nn.Module, args: tuple, out: Tensor) -> None:
            if out.requires_grad:
                out.register_hook(lambda g: seen_dy.__setitem__(name, _value(g).detach()))

        return pre, post

    for name, m in layers:
        pre, post = capture(name)
        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    try:
        loss_fn(twin(x)).backward()
    finally:
        for h in handles:
            h.remove()
    rows = []
    for name, m in layers:
        if name not in seen_x or name not in seen_dy:  # not on the loss's path for this batch
            continue
        xin, dy = seen_x[name], seen_dy[name]
        needs_dx = bool(seen_x[name + "/grad"])
        ref = _float_gemms(m, xin, dy)
        got = _int_gemms(m, xin, dy, needs_dx)
        kind = "Conv2d" if isinstance(m, QConv2d) else "Linear"
        for gemm, r, g in zip(PROBE_GEMMS, ref, got):
            if g is None:
                continue
            spec = getattr(m.precision, gemm)
            bits = f"{spec.lhs.fmt.bits}x{spec.rhs.fmt.bits}" if spec.integer else "float"
            rows.append(GemmSqnr(name, kind, gemm, bool(spec.integer), bits, sqnr_db(r, g.reshape(r.shape))))
    return rows
