"""``int8`` / ``int8-mixed``: the practical default — all three GEMMs in int8, float master weights.

The "int8 mixed" scheme of the integer-training literature (Zhu et al., CVPR 2020, Sec. 3; torchao's
int8 mixed-precision training; SwitchBack, Wortsman et al. 2023): every Linear/Conv2d runs

    y = x W^T,   dx = dy W,   dW = dy^T x

as int8 x int8 -> int32 products on a real integer kernel, with float32 master weights updated by
any torch optimizer.  Scales (Eq. ``s = amax / 127``):

- Linear: activations and output gradients one scale per row (token), weights one per output
  feature in forward and per input feature for ``dx``; for ``dW`` the gradient gets one scale per
  output feature and the activation one per input feature (the only layouts whose scale factors
  out of each integer sum).
- Conv2d: activations and gradients one scale per tensor (their scale cannot vary along the
  channel x window reduction), weights one per output channel (per input channel for ``dx``);
  the weight-gradient's output gradient one scale per output channel.

Differences from the papers: no gradient clipping search (that is the ``unified-int8`` recipe);
``bits`` > 8 runs Linear and Conv2d GEMMs exactly on int8 kernels by splitting int16 codes into halves.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..spec import GemmPrecision, LayerPrecision, PerChannel, PerTensor, QuantSpec, Rounding
from ..spec.formats import IntFormat
from .base import RecipeConfig, first_last_filter

__all__ = ["Int8MixedConfig"]


@dataclass(frozen=True)
class Int8MixedConfig(RecipeConfig):
    """Config of the ``int8`` recipe.

    Args:
        bits: code width of weights and activations (2..16; past 8 bits as exact int8 halves).
        grad_bits: code width of output gradients (defaults to ``bits``).
        grad_rounding: rounding of output gradients (``Rounding.STOCHASTIC`` is unbiased).
        weight_grad_rounding: rounding of the output gradient's codes in the weight-gradient GEMM only
            (default stochastic; None: ``grad_rounding``).  That GEMM sums over every row (token, pixel) of
            the batch, so nearest rounding's bias adds up there while stochastic rounding's noise averages
            out -- the argument of Gupta et al. 2015 ("Deep Learning with Limited Numerical Precision") for
            stochastic rounding of accumulated updates.  Measured: ``benchmarks/probe_recipes.py`` gives
            ResNet-20 weight gradients 14.5 dB SQNR with nearest, 31.4 dB with stochastic rounding (33.9 dB
            for the input gradient with nearest); ``benchmarks/accuracy_full.py`` (ResNet-20, 30 epochs,
            paired seeds) moved the gap to fp32 from -1.11 to -0.37 points, at no measurable step-time cost
            (the hash runs inside the conv weight-gradient kernel and the Linear gradient quantizer).
        per_channel: per-row/per-channel scales as described above; False gives one scale per tensor.
        float_weight_grad: run the weight-gradient GEMM in float32 (as torchao and SwitchBack allow).
        first_last_float: keep the model's first and last Linear/Conv2d in float32 (the common low-bit training
            policy: DoReFa Sec. 2.7; the first layer sees the raw input, the last writes the logits; ResNet-20's
            first conv and classifier are about 1% of its MACs).  ``benchmarks/accuracy_full.py`` (ResNet-20, 30
            epochs, three paired seeds): paired gap to fp32 -0.18 points with it, -0.44 without; off by default
            until more seeds separate the two (per seed +0.20 / -0.05 / +0.63).
        bf16_activations: run the forward under ``torch.autocast(device, bfloat16)`` (:meth:`autocast`): the
            integer layers hand on bfloat16 outputs and the float ops between them run on bfloat16, as under the
            ``bf16`` recipe; the integer GEMMs quantize the bfloat16 activations and gradients as they are.  The
            layout torchao's int8 training uses.  Off by default until its full-budget accuracy is measured.
        per_sample_grad: quantize a Conv2d's output gradient for the input-gradient GEMM with one scale per sample
            instead of one per tensor (the convolution's analogue of the row-wise gradient scales Linear layers
            have here and in torchao's recipe: that GEMM never sums across samples, so each sample's scale factors
            out).  Late in training a sample's gradient is a few percent of the batch's largest (ResNet-20 after
            30 epochs: median 3-10%), so one scale per tensor rounds 66-82% of the codes to zero and the
            input-gradient GEMM reads 23-37 dB SQNR; one per sample, 35-45 dB (``benchmarks/probe_per_sample.py``).
            ``benchmarks/accuracy_full.py`` (ResNet-20, 30 epochs, paired seeds): the paired gap to fp32 with it
            and without (``int8-pt``) is in its README; compiled, the step costs the same (``benchmarks/speed.py
            --families int8_pt``).  On by default; False keeps one scale per tensor (the default before).
        seed: base seed of the stochastic-rounding hash.
    """

    name = "int8"
    facts = ("int8 mixed precision: Zhu et al. CVPR 2020 Sec. 3; torchao's int8 mixed-precision training; "
             "SwitchBack (Wortsman et al. 2023)",
             "the three GEMMs of every Linear/Conv2d (int8 x int8 -> int32)",
             "master weights and optimizer (any torch optimizer), scales, element-wise ops, normalization, loss")
    bits: int = 8
    grad_bits: int | None = None
    grad_rounding: Rounding = Rounding.NEAREST_EVEN
    weight_grad_rounding: Rounding | None = Rounding.STOCHASTIC
    per_channel: bool = True
    float_weight_grad: bool = False
    first_last_float: bool = False
    bf16_activations: bool = False
    per_sample_grad: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.per_sample_grad, bool):
            raise ValueError(f"int8 per_sample_grad must be True or False, got {self.per_sample_grad!r}")
        for field_name in ("bits", "grad_bits"):
            value = getattr(self, field_name)
            if value is not None:
                IntFormat(value)  # raises UnsupportedFormatError naming the allowed range

    def _spec(self, bits: int, per_channel: bool, rounding: Rounding = Rounding.NEAREST_EVEN) -> QuantSpec:
        gran = PerChannel(0) if (per_channel and self.per_channel) else PerTensor()
        return QuantSpec(IntFormat(bits), gran, rounding)

    def precision_for(self, module: nn.Module, fqn: str) -> LayerPrecision | None:
        b, gb = self.bits, self.grad_bits or self.bits
        w, g = (lambda pc: self._spec(b, pc)), (lambda pc: self._spec(gb, pc, self.grad_rounding))
        wg_rounding = self.weight_grad_rounding or self.grad_rounding
        is_conv = isinstance(module, nn.Conv2d)
        act = not is_conv  # conv activations/gradients entering a reduction are per tensor
        # one scale per sample (PerChannel(0) of NCHW) for a conv's dx GEMM; Linear's rows are per sample already
        g_input = self._spec(gb, True, self.grad_rounding) if (is_conv and self.per_sample_grad) else g(act)
        return LayerPrecision(
            forward=GemmPrecision(w(act), w(True)),
            grad_input=GemmPrecision(g_input, w(True)),
            grad_weight=GemmPrecision(self._spec(gb, True, wg_rounding), w(act), integer=not self.float_weight_grad),
        )

    def autocast(self, device: str | torch.device = "cpu") -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast(device, bfloat16)`` when ``bf16_activations``: the integer layers then hand on their
        outputs in bfloat16 (:func:`inttrain.autograd.qactivation.output_dtype`) and the float ops between them
        (normalization, activations, residual adds) read and write half the bytes, as torchao's int8 training
        does under autocast; the codes and int32 sums of the three GEMMs are as without it."""
        if not self.bf16_activations:
            return contextlib.nullcontext()
        device_type = device if isinstance(device, str) else device.type
        return torch.autocast(device_type, dtype=torch.bfloat16)

    def layer_filter(self, model: nn.Module):
        return first_last_filter(model) if self.first_last_float else None
