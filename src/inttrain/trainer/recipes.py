"""How the trainer applies a recipe, through the public API only.

"fp32" is plain float training, "bf16" is CPU/GPU autocast done here, and every
other recipe is handed to ``inttrain.prepare_`` (which swaps the GEMM layers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["FLOAT_RECIPES", "get_prepare", "apply_recipe", "autocast_for"]

#: Recipes the trainer implements itself, without ``prepare_``.
FLOAT_RECIPES: tuple[str, ...] = ("fp32", "bf16")


def get_prepare() -> Callable[..., Any] | None:
    """``inttrain.prepare_`` if this build has it, else None."""
    import inttrain

    try:
        return inttrain.prepare_
    # The package resolves prepare_ lazily; a missing api module surfaces as
    # ImportError rather than AttributeError.
    except (AttributeError, ImportError):
        return None


def apply_recipe(model: nn.Module, recipe: str) -> None:
    """Prepare ``model`` in place for ``recipe`` (no-op for the float recipes)."""
    if recipe in FLOAT_RECIPES:
        return
    prepare = get_prepare()
    if prepare is None:
        raise ValueError(
            f"recipe {recipe!r} needs inttrain.prepare_, which this build does not provide; "
            f"available: {', '.join(FLOAT_RECIPES)}"
        )
    prepare(model, recipe)


def autocast_for(recipe: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The autocast context for a forward pass under ``recipe``."""
    if recipe == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
