"""``integer-only``: NITI-style integer-only training (Wang et al., "NITI: Training Integer Neural
Networks Using Integer-only Arithmetic", IEEE TPDS 2022) on the PyTorch engine :mod:`inttrain.integer_only`.

Unlike the other recipes this one does **not** go through :func:`inttrain.prepare_`: ``prepare_``
keeps float master weights and float autograd around integer GEMMs, while here there is no float
anywhere in a training step (int8 codes with power-of-two exponents, int32 accumulators, rounding
shifts, an integer softmax cross-entropy gradient and integer SGD; docs/integer-training.md). Its own
entry point is :func:`convert` (``inttrain.recipes.integer_only.convert(model, config)``), which turns
a float ``torch.nn.Sequential`` (its initial weights) into an :class:`inttrain.integer_only.Sequential`;
train it with :func:`optimizer` and :func:`inttrain.integer_only.train_epoch` / ``train_step``, save it
with its ``.save(dir)`` (micro's file format). For the same reason it is not listed in
``inttrain.recipes.RECIPES`` / ``from_name`` (those return ``prepare_`` configs).

What differs from NITI (see the doc for the exact arithmetic):

- softmax cross-entropy: NITI approximates the error with a power-of-two softmax; here exp is a Q15
  exp2 table with a Q8 ``log2(e)`` factor and the probabilities are exact integer divisions in Q7;
- update: NITI trains int8 weights with a bit-width-limited gradient; here the step is the exact int32
  gradient shifted either so that each tensor's largest step is ``2**lr_bits`` codes (the default norm rule)
  or by ``lr_shift`` (the shift rule), into int16 master weights (``weight_bits=16``, default) or the int8
  weights themselves (``weight_bits=8``, NITI's setting), with optional integer momentum, decay and a Q8
  schedule multiplier, and exponent adaptation that keeps master weights off the saturation limit;
- rounding modes are configurable per direction (NITI: pseudo-stochastic rounding from the discarded bits);
- convolutions have stride/padding, and there is a range batch norm and residual additions with
  exponent alignment (docs §4.1-§4.2), which NITI does not have. Biases are not supported (as in NITI).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .. import integer_only as T
from .. import micro
from ..micro.layers import MAX_GAIN_SHIFT, WEIGHT_VIEWS
from ..micro.ops import ROUNDING_MODES, qmax
from ..micro.optim import FRAC_BITS_MAX, default_bn_lr_bits

__all__ = ["IntegerOnlyConfig", "convert", "optimizer", "describe", "float_to_codes"]


@dataclass(frozen=True)
class IntegerOnlyConfig:
    """Config of the ``integer-only`` recipe.

    Args:
        forward_rounding / backward_rounding / update_rounding: shift rounding (``rne``, ``pstoch``,
            ``floor``, ``hstoch``) of activations, errors and weight updates (docs §2; errors default to
            ``hstoch``, unbiased hashed rounding, as ``python -m inttrain.micro train``).
        lr_mode: ``"norm"`` (default: each tensor's largest step is ``2**lr_bits`` codes at its starting
            exponent, scale-free) or ``"shift"`` (learning rate ``2**-lr_shift`` on the summed-batch gradient,
            NITI-style); docs §7.
        lr_bits: the norm rule's largest step, 0..14 (default 10, as ``python -m inttrain.micro train``).
        lr_shift: the shift rule's learning rate ``2**-lr_shift`` (0..62; used only with ``lr_mode="shift"``).
        bn_lr_bits: the norm rule's largest step for batch-norm gamma / beta, 0..14 (``None``, the default:
            ``lr_bits - 1``, as ``python -m inttrain.micro train``).
        momentum_shift: ``None`` (plain SGD) or ``m`` for beta = 1 - 2**-m (1..16).
        nesterov: Nesterov momentum (needs ``momentum_shift``): the step is the gradient step plus beta times the
            new momentum, as torch ``SGD(nesterov=True)``.
        adapt_exp: halve a tensor (exponent + 1) once it reaches half its code range (no saturated weights).
        decay_shift: ``None`` or ``D``: weight decay ``W -= rne(W / 2**D)`` per step (1..30).
        l2_shift: ``None`` or ``L``: L2 weight decay, ``2**-L * W`` added to the summed-batch gradient before the
            step rule (torch SGD's ``weight_decay`` times the batch size: ``L = 4`` is 5e-4 at batch 128; 0..30).
        frac_bits: ``None`` or ``F`` (1..15): each master weight keeps the part of its steps below one code in an
            int16 remainder of ``F`` fraction bits, so the many sub-code steps late in a schedule add up instead
            of each being rounded to a whole code (docs/integer-training.md §7; on ResNet-20 it changed nothing).
        The schedule is the training loop's: ``inttrain.micro.optim.Schedule`` passed to ``train_epoch``.
        weight_bits: master weights, 16 (int16 accumulators) or 8 (NITI's int8 weights).
        drop_bias: biases are not part of the arithmetic; ``False`` refuses a model with a non-zero bias,
            ``True`` drops them.
        seed: the description's seed (only micro's init RNG for layers :func:`convert` does not copy).
        bn_gain_shift: each converted batch norm's ``gain_shift`` (0..8): its output ``2**s * gamma * (x - mean)
            / range + beta``.  The range of a channel's M values is ~``2 sqrt(2 ln M)`` standard deviations
            (8-10 at ResNet-20's M = 8192..131072), so without it a range batch norm outputs ~1/9 of float batch
            norm's; ``3`` is Banner et al.'s range correction ``C(M)`` (2018, Sec. 4) as a power of two
            (docs/integer-training.md §4.2).  Default 3: ResNet-20 on 16k CIFAR images, 30 epochs, seed 0, held-out
            80.15% with it against 73.32% with 0 (``benchmarks/accuracy_full.py``, integer-only-bngain vs
            integer-only).  A model converted earlier keeps what it was saved with.
        bn_input_bits: 8, or 16: every convolution that feeds a batch norm hands it 16-bit codes (``"out_bits":
            16`` in its description), so each channel is normalized from a fine grid; with 8 a channel whose range
            is a small part of the tensor's has a few levels (after the ResNet-20 run of ``integer-only-bngain``,
            42% of the batch norms' channels had a range under 64 int8 codes).  Bit-exact in micro, this engine
            and the generated C.
        error_bits: 8, or 16: every layer hands the one before it 16-bit error codes, rounded to int8 only where a
            convolution's or linear layer's two backward GEMMs take them, and the loss gradient is int16 in Q15
            (``"error_bits": 16`` in the description).  With 8, each of ResNet-20's ~40 layers requantizes the
            error to int8 on its way back; on integer-only-bngain's trained weights the first seven convolutions'
            weight gradients then had cosines of 0.35-0.75 with float autograd's, 0.69-0.85 with 16
            (``benchmarks/integer_only_grad_probe.py``).  Bit-exact in micro, this engine and the generated C.
        weight_view: how the GEMMs' int8 view is cut from int16 master weights: ``"fixed"`` (``W16 >> 8``, rne)
            or ``"tensor"`` (``W16 >> s`` with ``s = bitlen(max |W16|) - 7``: the tensor's largest weight at
            64..127 codes; ``"weight_view": "tensor"`` in the description).  With the fixed shift and
            ``adapt_exp`` a tensor's largest view code is 32..64 and its median 3..8: after 22 epochs of
            integer-only-bngain-bn16 (ResNet-20) the views' SQNR against their master weights was 24-33 dB,
            33-42 dB with the tensor's shift (docs/integer-training.md §1).
    """

    name = "integer-only"
    forward_rounding: str = "rne"
    backward_rounding: str = "hstoch"
    update_rounding: str = "pstoch"
    lr_mode: str = "norm"
    lr_bits: int = 10
    lr_shift: int = 8
    bn_lr_bits: int | None = None
    momentum_shift: int | None = None
    nesterov: bool = False
    adapt_exp: bool = True
    decay_shift: int | None = None
    l2_shift: int | None = None
    frac_bits: int | None = None
    weight_bits: int = 16
    drop_bias: bool = False
    seed: int = 0
    bn_gain_shift: int = 3
    bn_input_bits: int = 8
    error_bits: int = 8
    weight_view: str = "fixed"

    def __post_init__(self) -> None:
        for f in ("forward_rounding", "backward_rounding", "update_rounding"):
            if getattr(self, f) not in ROUNDING_MODES:
                raise ValueError(f"integer-only {f}={getattr(self, f)!r}: allowed {ROUNDING_MODES}")
        if self.lr_mode not in ("norm", "shift"):
            raise ValueError(f"integer-only lr_mode={self.lr_mode!r}: allowed 'norm' or 'shift'")
        if not isinstance(self.nesterov, bool) or (self.nesterov and self.momentum_shift is None):
            raise ValueError(f"integer-only nesterov={self.nesterov!r}: allowed False, or True with a momentum_shift")
        for f, lo, hi, optional in (("lr_shift", 0, 62, False), ("lr_bits", 0, 14, False),
                                    ("momentum_shift", 1, 16, True), ("decay_shift", 1, 30, True),
                                    ("l2_shift", 0, 30, True), ("frac_bits", 1, FRAC_BITS_MAX, True),
                                    ("bn_lr_bits", 0, 14, True), ("bn_gain_shift", 0, MAX_GAIN_SHIFT, False)):
            v = getattr(self, f)
            if optional and v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ValueError(f"integer-only {f}={v!r}: allowed {'None or ' if optional else ''}{lo}..{hi}")
        for f in ("weight_bits", "bn_input_bits", "error_bits"):
            if getattr(self, f) not in (8, 16) or isinstance(getattr(self, f), bool):
                raise ValueError(f"integer-only {f}={getattr(self, f)!r}: allowed 8 or 16")
        if self.weight_view not in WEIGHT_VIEWS:
            raise ValueError(f"integer-only weight_view={self.weight_view!r}: allowed {' or '.join(map(repr, WEIGHT_VIEWS))}")

    @property
    def rounding(self) -> dict:
        return {"forward": self.forward_rounding, "backward": self.backward_rounding, "update": self.update_rounding}


def float_to_codes(w: np.ndarray, bits: int) -> tuple[np.ndarray, int]:
    """Float weights -> (codes, exponent) with micro's init rule: ``max|w|`` maps to about a quarter
    of the code range, ``E = ceil(log2(max|w| / (qmax // 4)))``, codes = round-half-even(w / 2**E)."""
    w = np.asarray(w, dtype=np.float64)
    quarter = qmax(bits) // 4
    amax = float(np.abs(w).max()) if w.size else 0.0
    if not math.isfinite(amax):
        raise ValueError("weights must be finite")
    exp = -(quarter.bit_length() - 1) if amax == 0.0 else math.ceil(math.log2(amax / quarter))
    codes = np.clip(np.rint(w / 2.0 ** exp), -qmax(bits), qmax(bits)).astype(np.int64)
    return codes, int(exp)


def _pair(v, what: str) -> int:
    if isinstance(v, tuple):
        if len(set(v)) != 1:
            raise ValueError(f"{what} must be square, got {v}")
        v = v[0]
    return int(v)


def layers_in_order(model: nn.Module) -> list[nn.Module]:
    """``model``'s layers in execution order: a ``Sequential``'s children (nested ones flattened); a model that
    declares ``as_sequential()`` (``inttrain.models``' CIFAR ResNets) is read through it."""
    if not isinstance(model, nn.Sequential) and callable(getattr(model, "as_sequential", None)):
        model = model.as_sequential()
    if not isinstance(model, nn.Sequential):
        raise TypeError("convert expects a torch.nn.Sequential (or a model with as_sequential(), such as "
                        "inttrain.models' resnet20)")
    out: list[nn.Module] = []
    for mod in model:
        out.extend(layers_in_order(mod) if isinstance(mod, nn.Sequential) else [mod])
    return out


def _describe_layers(mods: list[nn.Module], config: IntegerOnlyConfig, where: str) -> tuple[list, list]:
    """Micro layer specs of ``mods`` and, per spec, the float tensors to convert (``{"residual": (block, shortcut)}``
    for a residual block)."""
    layers, tensors = [], []
    for i, mod in enumerate(mods):
        w = f"{where}{i} ({type(mod).__name__})"
        if callable(getattr(mod, "residual_parts", None)):  # y = after(block(x) + shortcut(x)), e.g. BasicBlock
            block, shortcut, after = mod.residual_parts()
            lb, tb = _describe_layers(block, config, f"{w} block layer ")
            ls, ts = _describe_layers(shortcut, config, f"{w} shortcut layer ")
            la, ta = _describe_layers(after, config, f"{w} output layer ")
            layers += [{"type": "residual", "layers": lb, "shortcut": ls}, *la]
            tensors += [{"residual": (tb, ts)}, *ta]
            continue
        spec, ts = _describe_one(mod, config, w)
        if spec["type"] == "batchnorm" and config.bn_input_bits == 16 and layers and layers[-1]["type"] == "conv2d":
            layers[-1]["out_bits"] = 16
        layers.append(spec)
        tensors.append(ts)
    return layers, tensors


def _describe_one(mod: nn.Module, config: IntegerOnlyConfig, where: str) -> tuple[dict, dict]:
    bias = getattr(mod, "bias", None)
    if isinstance(mod, (nn.Linear, nn.Conv2d)) and bias is not None and not config.drop_bias:
        if bool((bias.detach() != 0).any()):
            raise ValueError(f"{where}: has a non-zero bias; build it with bias=False or set drop_bias=True")
    if isinstance(mod, nn.Linear):
        return {"type": "linear", "in_features": mod.in_features, "out_features": mod.out_features}, {"weight": mod.weight}
    if isinstance(mod, nn.Conv2d):
        if mod.groups != 1 or _pair(mod.dilation, "dilation") != 1 or mod.padding_mode != "zeros":
            raise ValueError(f"{where}: only groups=1, dilation=1, zero padding are supported")
        if isinstance(mod.padding, str):
            raise ValueError(f"{where}: give padding as an integer")
        return ({"type": "conv2d", "in_channels": mod.in_channels, "out_channels": mod.out_channels,
                 "kernel_size": _pair(mod.kernel_size, "kernel_size"), "stride": _pair(mod.stride, "stride"),
                 "padding": _pair(mod.padding, "padding")}, {"weight": mod.weight})
    if isinstance(mod, nn.BatchNorm2d):
        # the integer batch norm (docs §4.2) starts at gamma = 1, beta = 0, as torch's does; other values
        # (a trained model) would be silently dropped, so they are refused
        if mod.affine and bool((mod.weight.detach() != 1).any() or (mod.bias.detach() != 0).any()):
            raise ValueError(f"{where}: only an untrained batch norm (weight 1, bias 0) converts")
        gain = {"gain_shift": config.bn_gain_shift} if config.bn_gain_shift else {}
        return {"type": "batchnorm", "num_features": mod.num_features, **gain}, {}
    if isinstance(mod, nn.ReLU):
        return {"type": "relu"}, {}
    if isinstance(mod, (nn.MaxPool2d, nn.AvgPool2d)):
        k = _pair(mod.kernel_size, "kernel_size")
        s = k if mod.stride is None else _pair(mod.stride, "stride")
        odd = mod.ceil_mode or _pair(mod.padding, "padding") != 0 or (
            _pair(mod.dilation, "dilation") != 1 if isinstance(mod, nn.MaxPool2d) else mod.divisor_override is not None)
        if s != k or odd:
            raise ValueError(f"{where}: only non-overlapping pools (stride = kernel, no padding, floor) are supported")
        return {"type": "maxpool2d" if isinstance(mod, nn.MaxPool2d) else "avgpool2d", "kernel_size": k}, {}
    if isinstance(mod, nn.AdaptiveAvgPool2d):
        size = mod.output_size if isinstance(mod.output_size, tuple) else (mod.output_size,)
        if any(v != 1 for v in size):
            raise ValueError(f"{where}: only AdaptiveAvgPool2d(1) (global average pooling) is supported")
        return {"type": "globalavgpool2d"}, {}
    if isinstance(mod, nn.Flatten):
        if mod.start_dim != 1 or mod.end_dim != -1:
            raise ValueError(f"{where}: only Flatten(start_dim=1, end_dim=-1) is supported")
        return {"type": "flatten"}, {}
    raise ValueError(f"{where}: unsupported module; allowed: Linear, Conv2d, BatchNorm2d, ReLU, MaxPool2d, AvgPool2d, "
                     "AdaptiveAvgPool2d(1), Flatten, residual blocks (residual_parts())")


def describe(model: nn.Module, config: IntegerOnlyConfig, input_shape) -> tuple[dict, list]:
    """The micro model description of ``model`` and, per layer, its float tensors to convert."""
    layers, tensors = _describe_layers(layers_in_order(model), config, "layer ")
    if input_shape is None:
        first = layers[0] if layers else {}
        if first.get("type") != "linear":
            raise ValueError("input_shape is required unless the first layer is Linear")
        input_shape = [first["in_features"]]
    desc = {"input_shape": [int(d) for d in input_shape], "weight_bits": config.weight_bits,
            "rounding": config.rounding, "seed": config.seed, "layers": layers,
            **({"error_bits": 16} if config.error_bits == 16 else {}),
            **({"weight_view": config.weight_view} if config.weight_view != "fixed" else {})}
    return desc, tensors


def convert(model: nn.Module, config: IntegerOnlyConfig | None = None, input_shape=None,
            device: torch.device | str | None = None) -> T.Sequential:
    """An :class:`inttrain.integer_only.Sequential` with ``model``'s (float, e.g. freshly initialized)
    weights converted to integer codes (:func:`float_to_codes`, one exponent per tensor).

    ``model``: a ``torch.nn.Sequential`` (or a model with ``as_sequential()``, e.g. ``inttrain.models``' resnet20)
    of Linear / Conv2d (square kernel, stride, padding; no groups, no dilation) / BatchNorm2d (untrained) / ReLU /
    MaxPool2d, AvgPool2d (non-overlapping) / AdaptiveAvgPool2d(1) / Flatten, and residual blocks: modules with
    ``residual_parts() -> (block, shortcut, after)`` (lists of such modules; ``after`` follows the sum, e.g. the
    ReLU of ``inttrain.models.resnet.BasicBlock``).  ``input_shape``: ``[C, H, W]`` or ``[features]`` of one sample
    (optional when the first layer is Linear). The float model is not modified and not used afterwards.
    """
    config = config or IntegerOnlyConfig()
    desc, tensors = describe(model, config, input_shape)
    try:
        mm = micro.Sequential.from_description(desc)
    except micro.MicroFormatError as e:
        raise ValueError(str(e)) from None
    _copy_weights(mm.layers, tensors, config.weight_bits)
    return T.Sequential.from_micro(mm, device)


def _copy_weights(layers: list, tensors: list, bits: int) -> None:
    for ml, ts in zip(layers, tensors):
        if "residual" in ts:
            _copy_weights(ml.block, ts["residual"][0], bits)
            _copy_weights(ml.shortcut, ts["residual"][1], bits)
        elif "weight" in ts:
            codes, exp = float_to_codes(ts["weight"].detach().cpu().double().numpy(), bits)
            ml.weight.acc = codes.astype(ml.weight.acc.dtype)
            ml.weight.exp = ml.weight.exp0 = exp          # the norm rule's step unit is the starting exponent


def optimizer(model: T.Sequential, config: IntegerOnlyConfig | None = None) -> T.SGD:
    """The integer SGD of ``config`` (step rule, momentum, decay, exponent adaptation, update rounding) over
    ``model``'s parameters."""
    config = config or IntegerOnlyConfig()
    return T.SGD(model.params(), config.lr_shift, config.momentum_shift, config.update_rounding,
                 lr_mode=config.lr_mode, lr_bits=config.lr_bits, adapt_exp=config.adapt_exp,
                 decay_shift=config.decay_shift, l2_shift=config.l2_shift, frac_bits=config.frac_bits,
                 nesterov=config.nesterov,
                 bn_lr_bits=default_bn_lr_bits(config.lr_bits) if config.bn_lr_bits is None else config.bn_lr_bits)
