"""How the trainer applies a recipe, through the public API only.

"fp32" is plain float training, "bf16" is CPU/GPU autocast done here, and every
other recipe is handed to ``inttrain.prepare_`` (which swaps the GEMM layers).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

__all__ = ["FLOAT_RECIPES", "apply_recipe", "autocast_for"]

#: Recipes the trainer implements itself, without ``prepare_``.
FLOAT_RECIPES: tuple[str, ...] = ("fp32", "bf16")


def apply_recipe(model: nn.Module, recipe: Any, dataflow: bool = False) -> None:
    """Prepare ``model`` in place for ``recipe`` (a name or recipe config; no-op for the float recipes).

    ``dataflow``: int8 activations between layers (see :func:`inttrain.prepare_`).
    """
    if isinstance(recipe, str) and recipe in FLOAT_RECIPES:
        if dataflow:
            raise ValueError(f"dataflow needs an integer recipe; {recipe!r} trains in float")
        return
    import inttrain  # lazy: the integer layers are only loaded when a run uses them

    inttrain.prepare_(model, recipe, dataflow=dataflow)
    from .recipe_training import swap_norms_

    swap_norms_(model, recipe)  # wageubn: 8-bit BN, sbm: Range BN


def autocast_for(recipe: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The autocast context for a forward pass under ``recipe``."""
    if recipe == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
