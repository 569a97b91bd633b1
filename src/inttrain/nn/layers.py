"""Drop-in integer-training layers: ``QLinear`` and ``QConv2d``.

They are subclasses of ``nn.Linear`` / ``nn.Conv2d`` with the same parameters and buffers, so
``state_dict()`` keys, ``isinstance`` checks, hooks and optimizers that already hold the parameters
all keep working.  :func:`inttrain.prepare_` converts a module *in place* by switching its class
(no copy of the weights); :func:`inttrain.restore_` switches it back.

Stochastic rounding draws from a counter-based hash seeded by ``(seed, layer id, call count, GEMM)``,
so runs are reproducible without touching torch's global RNG.
"""

from __future__ import annotations

import torch
from torch import nn

from ..autograd import int_linear
from ..numerics.hashing import mix_seed
from ..spec import LayerPrecision

__all__ = ["QLinear", "QConv2d", "IntLayerMixin"]


class IntLayerMixin:
    """State shared by the integer layers: precision, seed and a call counter for stochastic rounding."""

    precision: LayerPrecision
    seed: int
    layer_id: int
    calls: int

    def _setup_int(self, precision: LayerPrecision, seed: int = 0, layer_id: int = 0) -> None:
        self.precision, self.seed, self.layer_id, self.calls = precision, int(seed), int(layer_id), 0

    def _next_seeds(self) -> tuple[int, int, int]:
        if self.training:
            self.calls += 1
        return tuple(mix_seed(self.seed, self.layer_id, self.calls, gemm) for gemm in range(3))  # type: ignore[return-value]

    def _int_repr(self) -> str:
        return f"precision=[{self.precision.describe()}]"


class QLinear(IntLayerMixin, nn.Linear):
    """``nn.Linear`` whose forward, input-gradient and weight-gradient GEMMs run on integer kernels."""

    @classmethod
    def convert(cls, module: nn.Linear, precision: LayerPrecision, seed: int = 0, layer_id: int = 0) -> "QLinear":
        if type(module) is not nn.Linear:
            raise TypeError(f"QLinear.convert expects exactly nn.Linear, got {type(module).__name__}")
        module.__class__ = cls
        module._setup_int(precision, seed, layer_id)  # type: ignore[attr-defined]
        return module  # type: ignore[return-value]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int_linear(x, self.weight, self.bias, self.precision, self._next_seeds())

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._int_repr()}"


class QConv2d(IntLayerMixin, nn.Conv2d):
    """``nn.Conv2d`` whose forward, input-gradient and weight-gradient convolutions run on integer kernels."""

    @classmethod
    def convert(cls, module: nn.Conv2d, precision: LayerPrecision, seed: int = 0, layer_id: int = 0) -> "QConv2d":
        from ..autograd.conv import check_conv_precision

        if type(module) is not nn.Conv2d:
            raise TypeError(f"QConv2d.convert expects exactly nn.Conv2d, got {type(module).__name__}")
        if module.padding_mode != "zeros" or isinstance(module.padding, str):
            raise ValueError(f"QConv2d supports zero padding given as numbers, got padding={module.padding!r},"
                             f" padding_mode={module.padding_mode!r}")
        check_conv_precision(precision)
        module.__class__ = cls
        module._setup_int(precision, seed, layer_id)  # type: ignore[attr-defined]
        return module  # type: ignore[return-value]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..autograd.conv import ConvGeometry, int_conv2d

        geom = ConvGeometry(tuple(self.stride), tuple(self.padding), tuple(self.dilation), self.groups)
        return int_conv2d(x, self.weight, self.bias, geom, self.precision, self._next_seeds())

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._int_repr()}"


def restore_module(module: nn.Module) -> nn.Module:
    """Switch an integer layer back to its plain torch class (in place)."""
    if isinstance(module, QLinear):
        module.__class__ = nn.Linear
    elif isinstance(module, QConv2d):
        module.__class__ = nn.Conv2d
    else:
        return module
    for attr in ("precision", "seed", "layer_id", "calls"):
        module.__dict__.pop(attr, None)
    return module
