"""``QConv1D``: the integer-training twin of Hugging Face transformers' GPT-2 ``Conv1D``.

transformers' ``Conv1D(nf, nx)`` is a Linear layer with its weight stored transposed (``[in, out]``) and
``forward(x) = x @ W + b``.  The integer layer runs the same three GEMMs as :class:`~inttrain.nn.QLinear`
on ``W^T`` (a view: no copy, the parameter and its ``state_dict`` key and shape do not change).

The class is made on first use as a subclass of the model's own ``Conv1D`` class, so ``isinstance(m,
Conv1D)`` checks inside transformers keep working and ``import inttrain`` never imports transformers.
"""

from __future__ import annotations

import torch
from torch import nn

from ..autograd import int_linear
from ..autograd.qactivation import dequantize_if_quantized
from .layers import IntLayerMixin

__all__ = ["is_hf_conv1d", "qconv1d_class", "QConv1DMixin", "QCONV1D_CLASSES"]


def is_hf_conv1d(module: nn.Module) -> bool:
    """True for exactly transformers' ``Conv1D`` (``transformers.pytorch_utils`` or a re-export of it)."""
    cls = type(module)
    return cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers.") and \
        isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.dim() == 2


class QConv1DMixin(IntLayerMixin):
    """Forward of the integer Conv1D: ``int_linear`` on the transposed weight view."""

    @property
    def in_features(self) -> int:
        return self.weight.shape[0]

    @property
    def out_features(self) -> int:
        return self.weight.shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, hook = self.weight.t(), None
        if self.hooks is not None:  # a recipe's float transform of the operands, on the [out, in] weight
            x = dequantize_if_quantized(x)
            x, w = self.hooks.forward_operands(self, x, w)
            hook = self.hooks.grad_output if self.training else None
        return int_linear(x, w, self.bias, self.precision, self._next_seeds(), grad_hook=hook, emit_int8=self.dataflow)


class _QConv1DClasses:
    """Owner of the integer classes made for transformers' ``Conv1D`` classes, one per float class, so every
    layer of one model (and of models prepared later) shares one class.  :meth:`clear` forgets them: layers
    already converted keep their class, the next conversion makes a new one."""

    def __init__(self) -> None:
        self._made: dict[type, type] = {}

    def get(self, float_cls: type) -> type:
        cls = self._made.get(float_cls)
        if cls is None:
            cls = type("QConv1D", (QConv1DMixin, float_cls), {"float_class": float_cls, "__module__": __name__})
            self._made[float_cls] = cls
            globals()["QConv1D"] = cls  # pickle finds the class by module + name
        return cls

    def clear(self) -> None:
        self._made.clear()


QCONV1D_CLASSES = _QConv1DClasses()


def qconv1d_class(float_cls: type) -> type:
    """The integer class for ``float_cls`` (transformers' ``Conv1D``), made once per class."""
    return QCONV1D_CLASSES.get(float_cls)
