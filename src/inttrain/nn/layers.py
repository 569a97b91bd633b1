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
from ..autograd.qactivation import dequantize_if_quantized
from ..autograd.relu import relu_int8_mask
from ..numerics.hashing import advance_seeds, mix_seed, mix_seed_tensor
from ..spec import LayerPrecision
from .per_sample import run_per_sample

__all__ = ["QLinear", "QConv2d", "IntLayerMixin", "MaskReLU"]


class IntLayerMixin:
    """State shared by the integer layers: precision, seed and a call counter for stochastic rounding.

    Subclasses name the plain torch class they replace in ``float_class``.
    """

    float_class: type[nn.Module]
    #: Optional per-layer recipe state (see :class:`inttrain.recipes.base.LayerHooks`): float elementwise
    #: transforms of the input / weight before quantization and of the output gradient in backward.
    hooks = None
    precision: LayerPrecision
    seed: int
    layer_id: int
    #: Dataflow (set by ``prepare_(..., dataflow=True)``): conv outputs leave as int8 QActivations.
    dataflow: bool = False
    #: Per-sample precision (set before each forward by per-sample DFQ): ``[(rows, LayerPrecision), ...]``,
    #: the batch split by width and run as one integer call per width (:mod:`inttrain.nn.per_sample`).
    sample_groups = None

    @classmethod
    def convert(cls, module: nn.Module, precision: LayerPrecision, seed: int = 0, layer_id: int = 0):
        """Turn ``module`` (exactly ``float_class``) into this integer layer, in place, and return it."""
        if type(module) is not cls.float_class:
            raise TypeError(f"{cls.__name__}.convert expects exactly {cls.float_class.__name__}, got {type(module).__name__}")
        cls._validate(module, precision)
        module.__class__ = cls
        module.precision, module.seed, module.layer_id = precision, int(seed), int(layer_id)
        # The stochastic-rounding call counter lives in a (non-persistent) buffer, not a Python int: a
        # compiled step then increments it inside the graph instead of recompiling for every new value.
        module.register_buffer("sr_calls", torch.zeros((), dtype=torch.int64, device=module.weight.device),
                               persistent=False)
        return module

    @property
    def calls(self) -> int:
        """Training calls so far (the stochastic-rounding counter; saved in checkpoints for exact resume)."""
        return int(self.sr_calls)

    @calls.setter
    def calls(self, value: int) -> None:
        self.sr_calls.fill_(int(value))

    @classmethod
    def _validate(cls, module: nn.Module, precision: LayerPrecision) -> None:
        """Raise if the integer kernels cannot serve ``module`` at ``precision``."""

    def _next_seeds(self) -> tuple:
        """Seeds of the three GEMMs for this call: ints in eager mode, 0-d tensors (same values) when compiling."""
        if torch.compiler.is_compiling():
            if self.training and self.hooks is None and not self.precision.uses_seeds:
                self.sr_calls.add_(1)  # round-to-nearest everywhere: the seeds are never read
                return (0, 0, 0)
            if self.training:
                return tuple(advance_seeds(self.sr_calls, self.seed, self.layer_id).unbind(0))
            return tuple(mix_seed_tensor(self.seed, self.layer_id, self.sr_calls, gemm) for gemm in range(3))
        calls = self.calls + 1 if self.training else self.calls
        if self.training:
            self.sr_calls.fill_(calls)
        return tuple(mix_seed(self.seed, self.layer_id, calls, gemm) for gemm in range(3))  # type: ignore[return-value]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, precision=[{self.precision.describe()}]"  # type: ignore[misc]


def _apply_hooks(layer, x: torch.Tensor):
    """``(x, weight, grad_hook)`` after the layer's recipe hooks (identity when it has none)."""
    hooks = layer.hooks
    if hooks is None:
        return x, layer.weight, None
    x, w = hooks.forward_operands(layer, x, layer.weight)
    return x, w, hooks.grad_output if layer.training else None


class QLinear(IntLayerMixin, nn.Linear):
    """``nn.Linear`` whose forward, input-gradient and weight-gradient GEMMs run on integer kernels."""

    float_class = nn.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hooks is not None:  # a recipe's float transform of the input: the int8 input becomes float
            x = dequantize_if_quantized(x)
        x, w, hook = _apply_hooks(self, x)
        if self.sample_groups is not None:  # per-sample bits: one integer GEMM per width present, float output
            return run_per_sample(self, dequantize_if_quantized(x), self.sample_groups,
                                  lambda xg, p, s: int_linear(xg, w, self.bias, p, s, grad_hook=hook))
        return int_linear(x, w, self.bias, self.precision, self._next_seeds(), grad_hook=hook,
                          emit_int8=self.dataflow)


class QConv2d(IntLayerMixin, nn.Conv2d):
    """``nn.Conv2d`` whose forward, input-gradient and weight-gradient convolutions run on integer kernels."""

    float_class = nn.Conv2d

    @classmethod
    def _validate(cls, module: nn.Module, precision: LayerPrecision) -> None:
        from ..autograd.conv import check_conv_precision

        if module.padding_mode != "zeros" or isinstance(module.padding, str):
            raise ValueError(f"QConv2d supports zero padding given as numbers, got padding={module.padding!r},"
                             f" padding_mode={module.padding_mode!r}")
        check_conv_precision(precision)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..autograd.conv import ConvGeometry, int_conv2d

        geom = ConvGeometry(tuple(self.stride), tuple(self.padding), tuple(self.dilation), self.groups)
        if self.hooks is not None:  # a recipe's float transform of the input: the int8 input becomes float
            x = dequantize_if_quantized(x)
        x, w, hook = _apply_hooks(self, x)
        if self.sample_groups is not None:  # per-sample bits: one integer convolution per width present
            return run_per_sample(self, dequantize_if_quantized(x), self.sample_groups,
                                  lambda xg, p, s: int_conv2d(xg, w, self.bias, geom, p, s, grad_hook=hook))
        return int_conv2d(x, w, self.bias, geom, self.precision, self._next_seeds(), grad_hook=hook,
                          emit_int8=self.dataflow)


class MaskReLU(nn.ReLU):
    """``nn.ReLU`` that, inside a compiled graph, saves its backward mask as int8 instead of bool
    (:mod:`inttrain.autograd.relu`: Inductor stores bool masks ~30x slower).  Eager and int8-dataflow
    inputs take torch's ReLU unchanged.  :func:`inttrain.prepare_` switches ``nn.ReLU`` modules to it."""

    float_class = nn.ReLU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() and type(x) is torch.Tensor:
            return relu_int8_mask(x)
        return super().forward(x)


def restore_module(module: nn.Module) -> nn.Module:
    """Switch an integer layer back to its plain torch class (in place)."""
    if type(module) is MaskReLU:
        module.__class__ = nn.ReLU
    if isinstance(module, IntLayerMixin):
        module.__class__ = module.float_class
        for attr in ("precision", "seed", "layer_id", "hooks", "dataflow", "sample_groups"):
            module.__dict__.pop(attr, None)
        module._buffers.pop("sr_calls", None)
    return module
