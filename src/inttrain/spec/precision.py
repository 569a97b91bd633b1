"""Per-GEMM precision of a layer: the three GEMMs of a training step, each with its own operands' specs.

A linear layer ``y = x W^T`` runs three GEMMs per training step:

- ``forward``:      ``y  = x  W^T``  (lhs = activation x, rhs = weight W)
- ``grad_input``:   ``dx = dy W``    (lhs = output gradient dy, rhs = weight W)
- ``grad_weight``:  ``dW = dy^T x``  (lhs = output gradient dy, rhs = activation x)

Recipes from the literature differ exactly here (Banner et al. 2018 keep the weight-gradient GEMM's
gradient in 16 bits; torchao lets the weight-gradient GEMM run in float), so each GEMM is
configured on its own.  Convolutions use the same three names.

Granularity inside a GEMM is about the *kept* (non-reduced) axis: ``PerChannel`` on an operand
means one scale per output row of the lhs or per output column of the rhs, which is the only
per-channel layout whose scale factors out of the integer sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .formats import PerBlock, PerChannel, QuantSpec, Rounding, UnsupportedFormatError

__all__ = ["GemmPrecision", "LayerPrecision"]


@dataclass(frozen=True)
class GemmPrecision:
    """Specs for the two operands of one GEMM; ``integer=False`` runs that GEMM in float32 instead."""

    lhs: QuantSpec = QuantSpec(granularity=PerChannel(0))
    rhs: QuantSpec = QuantSpec(granularity=PerChannel(0))
    integer: bool = True

    def __post_init__(self) -> None:
        for side in (self.lhs, self.rhs):
            if isinstance(side.granularity, PerBlock):
                raise UnsupportedFormatError(
                    "PerBlock granularity splits the reduction axis and is supported by quantize()/dequantize(),"
                    " not inside layer GEMMs; use PerTensor() or PerChannel() for GEMM operands"
                )

    def __str__(self) -> str:
        return f"{self.lhs} x {self.rhs}" if self.integer else "float32"


def _default(lhs_gran=PerChannel(0), rhs_gran=PerChannel(0)) -> GemmPrecision:
    return GemmPrecision(QuantSpec(granularity=lhs_gran), QuantSpec(granularity=rhs_gran))


@dataclass(frozen=True)
class LayerPrecision:
    """The three GEMMs' precisions for one layer (see module docstring for the names)."""

    forward: GemmPrecision = field(default_factory=_default)
    grad_input: GemmPrecision = field(default_factory=_default)
    grad_weight: GemmPrecision = field(default_factory=_default)

    @property
    def max_bits(self) -> int:
        gemms = (self.forward, self.grad_input, self.grad_weight)
        return max(max(g.lhs.bits, g.rhs.bits) for g in gemms if g.integer) if any(g.integer for g in gemms) else 32

    @property
    def uses_seeds(self) -> bool:
        """Whether any integer GEMM operand of this layer rounds stochastically (only then do seeds matter)."""
        return any(g.integer and Rounding.STOCHASTIC in (g.lhs.rounding, g.rhs.rounding)
                   for g in (self.forward, self.grad_input, self.grad_weight))

    def describe(self) -> str:
        return f"fwd={self.forward}, dx={self.grad_input}, dW={self.grad_weight}"

