"""``sbm``: Banner, Hubara, Hoffer, Soudry, "Scalable Methods for 8-bit Training of Neural Networks",
NeurIPS 2018.

- 8-bit weights and activations in the forward GEMM (Sec. 5);
- **gradient bifurcation** (Sec. 5, "Gradients bifurcation"): the output gradient is quantized to
  8 bits for the input-gradient GEMM ``dx = dy W`` (the error that keeps propagating) and to 16 bits
  for the weight-gradient GEMM ``dW = dy^T x`` (which feeds the update only);
- **stochastic rounding** of the gradients (Sec. 5), unbiased;
- **Range Batch Normalization** (Sec. 4, Eq. 4-5): :class:`inttrain.nn.range_bn.RangeBatchNorm2d`;
  ``prepare_(model, "sbm")`` swaps every BatchNorm2d for it (:meth:`SbmConfig.convert_norms_`).  As in the
  authors' reference code the range is averaged over 16 chunks of the batch: over one chunk its backward sent
  each channel's whole scale gradient to two values, and the 8-bit output gradient's SQNR in the input-gradient
  GEMM fell to 14 dB (29 dB with the chunks; ``benchmarks/probe_recipes.py``).

What is integer arithmetic: all three GEMMs.  The 16-bit ``dW`` GEMM is exact on int8 kernels: for
Linear each int16 code is split into two int8 halves (``kernels.matmul.split_int16``); for Conv2d the
weight-gradient convolution does the same split (``kernels.conv.conv2d_weight_grad``: three int8
convolutions recombined in int64, tested bit-exact against ``kernels.conv_reference``).

Differences from the paper: scales are per output channel / per row as in the ``int8`` recipe (the
paper quantizes per tensor, with its GEMMLOWP-style min/max); the paper's 8-bit Range BN arithmetic
itself is simulated in float32.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn

from ..nn.range_bn import use_range_bn_
from ..spec import LayerPrecision, Rounding, UnsupportedFormatError
from ..spec.formats import MAX_BITS, MIN_BITS, IntFormat
from .base import RecipeConfig
from .int8_mixed import Int8MixedConfig

__all__ = ["SbmConfig"]


@dataclass(frozen=True)
class SbmConfig(RecipeConfig):
    """Config of the ``sbm`` recipe.

    Args:
        bits: weights and activations (2..8).
        grad_bits: output gradient for the ``dx`` GEMM (2..8; the paper: 8).
        wgrad_bits: output gradient for the ``dW`` GEMM (2..16; the paper: 16).
        grad_rounding: rounding of both gradient copies (the paper: stochastic).
        range_bn: Range BN in place of every BatchNorm2d (the paper; default), or False: the model's own batch
            norm (an ablation: how much of the recipe's gap to fp32 is Range BN's).
    """

    name = "sbm"
    facts = ("Banner et al., Scalable Methods for 8-bit Training of Neural Networks, NeurIPS 2018",
             "the three GEMMs; the 16-bit weight-gradient GEMM exactly on int8 kernels (int16 split)",
             "Range BatchNorm arithmetic (simulated in float32), master weights")
    bits: int = 8
    grad_bits: int = 8
    wgrad_bits: int = 16
    grad_rounding: Rounding = Rounding.STOCHASTIC
    range_bn: bool = True

    def __post_init__(self) -> None:
        for field_name, hi in (("bits", 8), ("grad_bits", 8), ("wgrad_bits", MAX_BITS)):
            v = getattr(self, field_name)
            if not isinstance(v, int) or isinstance(v, bool) or not MIN_BITS <= v <= hi:
                raise UnsupportedFormatError(f"sbm {field_name}={v!r}: allowed {MIN_BITS} to {hi}")
        if not isinstance(self.range_bn, bool):
            raise UnsupportedFormatError(f"sbm range_bn={self.range_bn!r}: allowed True or False")

    def convert_norms_(self, model: nn.Module) -> nn.Module:
        """Range BN (Sec. 4) in place of every BatchNorm2d (``range_bn``; else the model's own)."""
        return use_range_bn_(model) if self.range_bn else model

    def precision_for(self, module: nn.Module, fqn: str) -> LayerPrecision | None:
        low = Int8MixedConfig(bits=self.bits, grad_bits=self.grad_bits, grad_rounding=self.grad_rounding,
                              weight_grad_rounding=None,  # the paper's one rounding for both gradient copies
                              per_sample_grad=False)  # and its one scale per tensor
        prec = low.precision_for(module, fqn)
        gw = prec.grad_weight
        wide = dataclasses.replace(gw, lhs=dataclasses.replace(gw.lhs, fmt=IntFormat(self.wgrad_bits)))
        return dataclasses.replace(prec, grad_weight=wide)
