"""How the trainer applies a recipe: through the public API and the recipe object's own methods only.

Every recipe, the float ones included, is a :class:`inttrain.recipes.RecipeConfig`: ``prepare_`` converts
the model (a no-op for fp32 and bf16) and the config gives the autocast, optimizer, step hook and state.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

__all__ = ["apply_recipe", "autocast_for", "get_recipe"]


def get_recipe(recipe: Any) -> Any:
    """The :class:`~inttrain.recipes.RecipeConfig` for a name or config."""
    import inttrain  # lazy: the integer layers are only loaded when a run uses them

    return inttrain.get_config(recipe)


def apply_recipe(model: nn.Module, recipe: Any, dataflow: bool = False) -> None:
    """Prepare ``model`` in place for ``recipe`` (a name or recipe config; no-op for the float recipes).

    ``dataflow``: int8 activations between layers (see :func:`inttrain.prepare_`).
    """
    import inttrain

    cfg = get_recipe(recipe)
    if dataflow and not cfg.converts_layers():
        raise ValueError(f"dataflow needs an integer recipe; {cfg.name!r} trains in float")
    inttrain.prepare_(model, cfg, dataflow=dataflow)


def autocast_for(recipe: Any, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The autocast context for a forward pass under ``recipe`` (a name or config)."""
    return get_recipe(recipe).autocast(device)
