"""``fp32``: the float32 baseline under the same API (``prepare_`` leaves the model untouched)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..spec import LayerPrecision
from .base import RecipeConfig

__all__ = ["Fp32Config"]


@dataclass(frozen=True)
class Fp32Config(RecipeConfig):
    """Plain float32 training: the reference every recipe is compared against."""

    name = "fp32"
    facts = ("none (the baseline)", "nothing", "everything: float32 weights, activations, gradients")

    def precision_for(self, module: nn.Module, fqn: str) -> LayerPrecision | None:
        return None

    def converts_layers(self) -> bool:
        return False
