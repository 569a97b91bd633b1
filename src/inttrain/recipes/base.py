"""What every recipe config provides: a name, a seed, and a precision for each layer it converts."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..spec import LayerPrecision

__all__ = ["RecipeConfig", "LayerHooks"]


class LayerHooks:
    """Per-layer recipe state attached by :func:`inttrain.prepare_` (``layer.hooks``); identity by default.

    ``forward_operands`` returns the (float, differentiable) input and weight handed to the integer GEMMs;
    ``grad_output(dy, seed)`` transforms the float output gradient in backward before it is quantized.
    """

    def forward_operands(self, layer: nn.Module, x: torch.Tensor, weight: torch.Tensor):
        return x, weight

    def grad_output(self, dy: torch.Tensor, seed: int) -> torch.Tensor:
        return dy


@dataclass(frozen=True)
class RecipeConfig:
    """Base of the frozen per-recipe configs applied by :func:`inttrain.prepare_`.

    Subclasses set ``name`` and override :meth:`precision_for`; returning ``None`` leaves a layer in float.
    """

    name = "base"
    seed: int = 0

    def precision_for(self, module: nn.Module, fqn: str) -> LayerPrecision | None:
        raise NotImplementedError

    def hooks_for(self, module: nn.Module, fqn: str) -> LayerHooks | None:
        """Per-layer transforms/state for ``module`` (None: the plain integer layer)."""
        return None

    def layer_filter(self, model: nn.Module):
        """A recipe-level ``(module, fqn) -> bool`` for ``model`` (e.g. keep first/last layer float), or None."""
        return None

    def converts_layers(self) -> bool:
        """False for float baselines (fp32), which leave the model untouched."""
        return True
