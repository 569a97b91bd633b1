"""The recipe's training parts as the trainer used to ask for them; each now delegates to the recipe object.

Kept for callers of the earlier helpers: :meth:`inttrain.recipes.RecipeConfig.optimizer_for`,
:meth:`~inttrain.recipes.RecipeConfig.step_hook`, :meth:`~inttrain.recipes.RecipeConfig.convert_norms_` and
:meth:`~inttrain.recipes.RecipeConfig.training_state` are the one place each of these lives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from inttrain.recipes.base import layer_hook_state, load_layer_hook_state, no_step_hook

from .recipes import get_recipe

__all__ = ["swap_norms_", "build_recipe_optimizer", "layer_hook_state", "load_layer_hook_state"]


def swap_norms_(model: nn.Module, recipe: Any) -> nn.Module:
    """Replace ``model``'s BatchNorm2d layers by the recipe's own (wageubn: 8-bit BN, sbm: Range BN), in place."""
    return get_recipe(recipe).convert_norms_(model)


def build_recipe_optimizer(
    model: nn.Module, recipe: Any, optimizer: str, lr: float, dclr: bool = True, *,
    momentum: float = 0.9, weight_decay: float = 0.0, nesterov: bool = False,
) -> tuple[torch.optim.Optimizer, Callable[[], None] | None]:
    """(the recipe's optimizer, its step hook or None when it has none); ``dclr=False``: no per-layer lr scaling."""
    cfg = get_recipe(recipe)
    opt = cfg.optimizer_for(model, optimizer, lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                            lr_scaling=dclr)
    hook = cfg.step_hook(opt)
    return opt, None if hook is no_step_hook else hook
