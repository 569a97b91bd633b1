"""What every recipe config provides: a name, a seed, and a precision for each layer it converts."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..spec import LayerPrecision

__all__ = ["RecipeConfig"]


@dataclass(frozen=True)
class RecipeConfig:
    """Base of the frozen per-recipe configs applied by :func:`inttrain.prepare_`.

    Subclasses set ``name`` and override :meth:`precision_for`; returning ``None`` leaves a layer in float.
    """

    name = "base"
    seed: int = 0

    def precision_for(self, module: nn.Module, fqn: str) -> LayerPrecision | None:
        raise NotImplementedError

    def converts_layers(self) -> bool:
        """False for float baselines (fp32), which leave the model untouched."""
        return True
