"""What both adapters share: converting a model for a recipe, its state for checkpoints, kernel counts.

Only inttrain's public API is used here (``inttrain.prepare_``, ``conversion_report``, ``inttrain.kernels``'
counters and the trainer's recipe helpers).
"""

from __future__ import annotations

from typing import Any

from torch import nn

import inttrain
from inttrain.kernels import int_kernel_calls
from inttrain.nn import IntLayerMixin
from inttrain.recipes import RecipeConfig

__all__ = ["recipe_name", "convert", "recipe_state", "load_recipe_state", "KernelCounts"]


class RecipeSettings:
    """What both framework callbacks are given.

    Args:
        recipe: a recipe name (``"int8"``, ``"unified-int8"``...) or config object; ``"fp32"`` changes nothing.
        dataflow: int8 activations between layers (see :func:`inttrain.prepare_`).
        **prepare_kwargs: passed on to :func:`inttrain.prepare_` (e.g. ``filter_fn``).
    """

    def __init__(self, recipe: str | RecipeConfig = "int8", dataflow: bool = False, **prepare_kwargs: Any) -> None:
        self.recipe, self.name = recipe, recipe_name(recipe)
        self.dataflow, self.prepare_kwargs = dataflow, prepare_kwargs
        self.report = None


def recipe_name(recipe: str | RecipeConfig) -> str:
    """The recipe's name; ValueError for unknown names and for bf16 (the framework's own autocast does that)."""
    if isinstance(recipe, str) and recipe == "bf16":
        raise ValueError("recipe 'bf16' is float training under autocast: use the framework's own bf16 mixed "
                         "precision (Lightning precision='bf16-mixed', transformers bf16=True) instead")
    return "fp32" if recipe == "fp32" else inttrain.get_config(recipe).name


def convert(model: nn.Module, recipe: str | RecipeConfig, dataflow: bool, prepare_kwargs: dict[str, Any]):
    """``prepare_`` (layers and the recipe's norm layers, as ``inttrain train`` does); the report."""
    if recipe != "fp32":
        inttrain.prepare_(model, recipe, dataflow=dataflow, **prepare_kwargs)
    return inttrain.conversion_report(model)


def recipe_state(model: nn.Module, recipe: str) -> dict[str, Any]:
    """State that decides how integer training continues and is not in ``model.state_dict()``:
    stochastic-rounding call counters and the recipe hooks' state (e.g. unified-int8's DSGC)."""
    from inttrain.recipes.base import layer_hook_state

    calls = {n: int(m.calls) for n, m in model.named_modules() if isinstance(m, IntLayerMixin)}
    return {"recipe": recipe, "layer_calls": calls, "hook_state": layer_hook_state(model)}


def load_recipe_state(model: nn.Module, state: dict[str, Any], recipe: str) -> None:
    """Put back :func:`recipe_state`; ValueError if it was saved under another recipe or another model."""
    from inttrain.recipes.base import load_layer_hook_state

    if state.get("recipe") != recipe:
        raise ValueError(f"checkpoint was trained with recipe {state.get('recipe')!r}, this callback runs {recipe!r}")
    modules = dict(model.named_modules())
    for name, calls in state.get("layer_calls", {}).items():
        if not isinstance(modules.get(name), IntLayerMixin):
            raise ValueError(f"checkpoint has integer layer {name!r}, which this model lacks or keeps in float")
        modules[name].calls = int(calls)
    load_layer_hook_state(model, state.get("hook_state", {}))


class KernelCounts:
    """Integer kernel launches since the last :meth:`take` (the counters are process-wide; this diffs them)."""

    def __init__(self) -> None:
        self._last = int_kernel_calls()

    def take(self) -> dict[str, int]:
        now = int_kernel_calls()
        diff = {k: v - self._last.get(k, 0) for k, v in now.items()}
        self._last = now
        return {k: v for k, v in diff.items() if v}
