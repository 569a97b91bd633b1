"""How far an integer-only model's forward and weight gradients are from float arithmetic on the same weights.

    python benchmarks/integer_only_grad_probe.py MODEL_DIR DATA.npz [--batches 8] [--batch-size 128]
        [--backward-rounding hstoch] [--error-bits 16] [--trace]

MODEL_DIR is a saved ``inttrain.micro`` model (``model.json`` + ``weights.safetensors``, e.g. a run's ``micro/``
folder of ``benchmarks/accuracy_full.py``), DATA.npz micro's data file (int8 ``x``, ``x_exp``, ``y``).  On the
first ``--batches`` batches (in order, no augmentation) it prints

* the mean cross-entropy of micro's integer forward and of a float64 twin of the same layers (convolutions,
  linear layers, micro's range batch norm with its ``gain_shift``, residual adds, pools) on the master weights and
  on the int8 weight views the integer GEMMs use: if they agree, the integer forward costs the trained weights
  nothing;
* per parameter tensor, the cosine between micro's weight gradient of one batch and the float twin's autograd
  gradient (int8 weight views in the forward, the batch norms' range held constant as micro's backward holds it),
  averaged over the batches: how much of micro's per-step gradient is signal;
* the same cosine for the float twin whose errors stay float between layers and are rounded to int8 (power-of-two
  per-tensor scale, unbiased stochastic rounding) only where a convolution's two backward GEMMs take them -- the
  int8 recipe's structure -- against its exact gradient: what requantizing every layer's error costs micro;
* micro's cosine against float autograd through micro's *own* forward values (each layer's output forced to
  micro's, the derivative the float layer's at micro's input): the backward's arithmetic alone, without the
  difference between the integer and the float forward.

``--trace`` adds, for the first batch, each layer's output error as micro's backward receives it against the
gradient of that layer's output in float autograd through micro's own forward (cosine and norm ratio): where the
backward's requantizations lose the error.

``--error-bits 16`` runs micro's backward with 16-bit errors between layers (``IntegerOnlyConfig.error_bits``)
on the same weights.

Used for issue 16's integer-only gap (README, integer-only paragraph).  It changes nothing in the model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

try:
    import inttrain  # noqa: F401
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from inttrain.micro import layers as L  # noqa: E402
from inttrain.micro.loss import softmax_cross_entropy_grad  # noqa: E402
from inttrain.micro.model import load_data, load_model  # noqa: E402
from inttrain.micro.ops import IntTensor  # noqa: E402


def real_value(p: L.Param, view: bool) -> torch.Tensor:
    """A parameter's real values in float64: its int8 GEMM view (``view``) or its master codes."""
    if view:
        v = p.int8()
        return torch.tensor(v.q.astype(np.float64) * 2.0 ** v.exp)
    return torch.tensor(p.acc.astype(np.float64) * 2.0 ** p.exp)


def float_forward(layers: list, x: torch.Tensor, weights: dict[int, torch.Tensor], range_grad: bool = False,
                  conv: Any = None, forced: dict[int, torch.Tensor] | None = None,
                  keep: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
    """micro's layers in float64 with ``weights`` (id(Param) -> tensor); the range is a constant unless
    ``range_grad``; ``conv(x, w, stride, padding)`` runs the convolutions (default: F.conv2d).  ``forced``
    (id(layer) -> micro's output values): each layer's output takes micro's value while its gradient stays the
    float layer's at micro's input (``y + (forced - y).detach()``), so autograd differentiates micro's own forward.
    ``keep``: filled with each layer's output (id(layer) -> tensor, its gradient retained)."""
    conv = conv or (lambda a, w, stride, padding: F.conv2d(a, w, stride=stride, padding=padding))
    for layer in layers:
        x = _float_layer(layer, x, weights, range_grad, conv, forced, keep)
        if forced is not None and id(layer) in forced:
            x = x + (forced[id(layer)] - x).detach()
        if keep is not None and x.requires_grad:
            x.retain_grad()
            keep[id(layer)] = x
    return x


def _float_layer(layer: Any, x: torch.Tensor, weights: dict[int, torch.Tensor], range_grad: bool, conv: Any,
                 forced: dict[int, torch.Tensor] | None, keep: dict[int, torch.Tensor] | None) -> torch.Tensor:
    """One micro layer in float64 (see :func:`float_forward`)."""
    if isinstance(layer, L.Conv2d):
        x = conv(x, weights[id(layer.weight)], layer.stride, layer.padding)
    elif isinstance(layer, L.Linear):
        x = x @ weights[id(layer.weight)].T
    elif isinstance(layer, L.BatchNorm):
        dims = (0, 2, 3) if x.dim() == 4 else (0,)
        shape = (1, -1, 1, 1) if x.dim() == 4 else (1, -1)
        mu = x.mean(dims, keepdim=True)
        r = (x.amax(dims, keepdim=True) - x.amin(dims, keepdim=True)).clamp_min(1e-30)
        if not range_grad:      # micro's backward: the range's value, the derivative of a standard deviation
            std = x.var(dims, unbiased=False, keepdim=True).sqrt().clamp_min(1e-30)
            r = std * (r / std).detach()
        x = (x - mu) / r * weights[id(layer.gamma)].view(shape) * 2.0 ** layer.gain_shift + weights[id(layer.beta)].view(shape)
    elif isinstance(layer, L.ReLU):
        x = x.relu()                        # gradient only where x > 0, as micro (clamp_min passes x == 0 too)
    elif isinstance(layer, L.Residual):
        x = float_forward(layer.block, x, weights, range_grad, conv, forced, keep) + (
            float_forward(layer.shortcut, x, weights, range_grad, conv, forced, keep) if layer.shortcut else x)
    elif isinstance(layer, L.AvgPool2d):
        x = x.mean((2, 3), keepdim=True) if layer.global_pool else F.avg_pool2d(x, layer.kernel_size)
    elif isinstance(layer, L.MaxPool2d):
        x = F.max_pool2d(x, layer.kernel_size)
    elif isinstance(layer, L.Flatten):
        x = x.flatten(1)
    else:  # pragma: no cover - every micro layer is handled above
        raise TypeError(f"no float twin for {type(layer).__name__}")
    return x


def _all_layers(layers: list, prefix: str = "layers") -> list[tuple[str, Any]]:
    """(name, layer) of every layer in forward order, residual branches included (named as the parameters are)."""
    out = []
    for i, layer in enumerate(layers):
        out.append((f"{prefix}.{i}", layer))
        if isinstance(layer, L.Residual):
            out += _all_layers(layer.block, f"{prefix}.{i}.block") + _all_layers(layer.shortcut, f"{prefix}.{i}.shortcut")
    return out


def integer_forward_values(model: Any, x: IntTensor) -> tuple[IntTensor, dict[int, torch.Tensor]]:
    """micro's forward of ``x`` and every layer's output values (id(layer) -> float64 tensor)."""
    values: dict[int, torch.Tensor] = {}
    layers = [layer for _, layer in _all_layers(model.layers)]

    def recording(layer: Any) -> Any:
        def forward(a: IntTensor) -> IntTensor:
            y = type(layer).forward(layer, a)
            values[id(layer)] = torch.tensor(y.q.astype(np.float64) * 2.0 ** y.exp)
            return y
        return forward

    for layer in layers:
        layer.forward = recording(layer)
    try:
        logits = model.forward(x)
    finally:
        for layer in layers:
            del layer.forward
    return logits, values


def stochastic_int8(g: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``g`` on an int8 grid with a power-of-two per-tensor scale, rounded stochastically (unbiased)."""
    amax = g.abs().max()
    if amax == 0:
        return g
    scale = 2.0 ** torch.ceil(torch.log2(amax / 127))
    v = g / scale
    return torch.floor(v + torch.rand(v.shape, generator=gen, dtype=v.dtype)).clamp(-127, 127) * scale


class Int8ErrorConv(torch.autograd.Function):
    """A convolution whose output error is rounded to int8 (:func:`stochastic_int8`) for both backward GEMMs."""

    @staticmethod
    def forward(ctx, x, w, stride, padding, gen):  # noqa: ANN001, ANN205 - torch's signature
        ctx.save_for_backward(x, w)
        ctx.conv = (stride, padding, gen)
        return F.conv2d(x, w, stride=stride, padding=padding)

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        x, w = ctx.saved_tensors
        stride, padding, gen = ctx.conv
        gq = stochastic_int8(g, gen)
        return (torch.nn.grad.conv2d_input(x.shape, w, gq, stride=stride, padding=padding),
                torch.nn.grad.conv2d_weight(x, w.shape, gq, stride=stride, padding=padding), None, None, None)


def _twin_grads(model: Any, xf: torch.Tensor, yt: torch.Tensor, int8_errors: torch.Generator | None,
                forced: dict[int, torch.Tensor] | None = None) -> list[np.ndarray]:
    """The float twin's weight gradients (int8 views in the forward): exact, or with int8 conv error operands;
    ``forced``: through micro's own forward values (:func:`float_forward`)."""
    params = model.params()
    views = {id(p): real_value(p, p.role != "norm").requires_grad_(True) for p in params}
    if int8_errors is None:
        conv = lambda a, w, stride, padding: F.conv2d(a, w, stride=stride, padding=padding)  # noqa: E731
    else:
        conv = lambda a, w, stride, padding: Int8ErrorConv.apply(a, w, stride, padding, int8_errors)  # noqa: E731
    F.cross_entropy(float_forward(model.layers, xf, views, conv=conv, forced=forced), yt, reduction="sum").backward()
    return [views[id(p)].grad.numpy().ravel() for p in params]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b) / (float(np.linalg.norm(a) * np.linalg.norm(b)) or 1.0)


def probe(model: Any, x: np.ndarray, x_exp: int, y: np.ndarray, batches: int, batch_size: int) -> dict[str, Any]:
    """Losses (integer, float on int8 views, float on master weights) and per-parameter gradient cosines."""
    params = model.params()
    losses: dict[str, list[float]] = {"integer": [], "float_int8_views": [], "float_master": []}
    cosines, structure, own = np.zeros(len(params)), np.zeros(len(params)), np.zeros(len(params))
    gen = torch.Generator().manual_seed(0)
    n = 0
    for b in range(batches):
        idx = np.arange(b * batch_size, min(len(x), (b + 1) * batch_size))
        if len(idx) == 0:
            break
        yt = torch.tensor(y[idx])
        logits, values = integer_forward_values(model, IntTensor(x[idx], x_exp))
        losses["integer"].append(F.cross_entropy(torch.tensor(logits.q.astype(np.float64) * 2.0 ** logits.exp), yt).item())
        err, _ = softmax_cross_entropy_grad(logits, y[idx], bits=model.err_bits)
        model.backward(err)
        grads = [None if p.grad is None else p.grad.astype(np.float64) * 2.0 ** p.grad_exp for p in params]
        for p in params:
            p.grad = None
        xf = torch.tensor(x[idx].astype(np.float64) * 2.0 ** x_exp)
        with torch.no_grad():
            master = {id(p): real_value(p, False) for p in params}
            losses["float_master"].append(F.cross_entropy(float_forward(model.layers, xf, master), yt).item())
            views = {id(p): real_value(p, p.role != "norm") for p in params}
            losses["float_int8_views"].append(F.cross_entropy(float_forward(model.layers, xf, views), yt).item())
        exact, coarse = _twin_grads(model, xf, yt, None), _twin_grads(model, xf, yt, gen)
        through = _twin_grads(model, xf, yt, None, values)
        for i in range(len(params)):
            if grads[i] is not None:
                cosines[i] += _cosine(grads[i].ravel(), exact[i])
                own[i] += _cosine(grads[i].ravel(), through[i])
            structure[i] += _cosine(coarse[i], exact[i])
        n += 1
    names = [name for name, _ in model.named_params()]
    return {"losses": {k: float(np.mean(v)) for k, v in losses.items()}, "batches": n,
            "cosines": dict(zip(names, (cosines / max(n, 1)).tolist())),
            "cosines_int8_gemm_errors": dict(zip(names, (structure / max(n, 1)).tolist())),
            "cosines_own_forward": dict(zip(names, (own / max(n, 1)).tolist()))}


def error_trace(model: Any, x: np.ndarray, x_exp: int, y: np.ndarray) -> list[tuple[str, str, float, float]]:
    """For one batch, each layer's output error as micro's backward receives it against the gradient of that
    layer's output in float autograd through micro's own forward values: (layer name, type, cosine, norm ratio
    micro / float), from the loss down to the first layer.  Shows where the backward's arithmetic loses the
    direction (and the scale) of the error."""
    logits, values = integer_forward_values(model, IntTensor(x, x_exp))
    named = _all_layers(model.layers)
    received: dict[int, np.ndarray] = {}

    def recording(layer: Any) -> Any:
        def backward(g: IntTensor) -> IntTensor | None:
            received[id(layer)] = g.q.astype(np.float64) * 2.0 ** g.exp
            return type(layer).backward(layer, g)
        return backward

    for _, layer in named:
        layer.backward = recording(layer)
    try:
        err, _ = softmax_cross_entropy_grad(logits, y, bits=model.err_bits)
        model.backward(err)
    finally:
        for _, layer in named:
            del layer.backward
    for p in model.params():
        p.grad = None
    weights = {id(p): real_value(p, p.role != "norm").requires_grad_(True) for p in model.params()}
    keep: dict[int, torch.Tensor] = {}
    out = float_forward(model.layers, torch.tensor(x.astype(np.float64) * 2.0 ** x_exp), weights, forced=values,
                        keep=keep)
    F.cross_entropy(out, torch.tensor(y), reduction="sum").backward()
    rows = []
    for name, layer in reversed(named):
        got, ref = received.get(id(layer)), keep.get(id(layer))
        if got is None or ref is None or ref.grad is None:
            continue
        a, b = got.ravel(), ref.grad.numpy().ravel()
        rows.append((name, type(layer).__name__, _cosine(a, b), float(np.linalg.norm(a) / (np.linalg.norm(b) or 1.0))))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a saved inttrain.micro model folder")
    ap.add_argument("data", help="micro DATA.npz (int8 x, x_exp, y)")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--backward-rounding", default=None, help="override the model's error rounding (rne, hstoch, ...)")
    ap.add_argument("--error-bits", type=int, choices=(8, 16), default=None,
                    help="override the model's error width between layers")
    ap.add_argument("--trace", action="store_true",
                    help="also print, per layer, micro's backward error against float autograd's (first batch)")
    args = ap.parse_args(argv)
    model = load_model(args.model)
    rounding = {**model.desc["rounding"], "backward": args.backward_rounding} if args.backward_rounding else None
    model = load_model(args.model, rounding=rounding, error_bits=args.error_bits)
    x, x_exp, y = load_data(args.data)
    r = probe(model, x, x_exp, y, args.batches, args.batch_size)
    print(f"{args.model}: {r['batches']} batches of {args.batch_size}, rounding {model.desc['rounding']}, "
          f"{model.err_bits}-bit errors")
    for k, v in r["losses"].items():
        print(f"  training loss, {k:17s} {v:.4f}")
    print("  cosine with the float twin's exact gradient, per parameter: micro's / the twin's with int8 GEMM errors;"
          " then micro's against float backward through micro's own forward values")
    for name, c in r["cosines"].items():
        print(f"    {name:32s} {c:+.3f} / {r['cosines_int8_gemm_errors'][name]:+.3f}    {r['cosines_own_forward'][name]:+.3f}")
    if args.trace:
        print("  each layer's output error, micro's backward against float autograd through micro's own forward "
              "(first batch): cosine, norm ratio")
        n = min(len(x), args.batch_size)
        for name, kind, c, ratio in error_trace(model, x[:n], x_exp, y[:n]):
            print(f"    {name:32s} {kind:10s} {c:+.4f}  {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
