"""What a recipe needs from the training loop beyond ``prepare_``: its optimizer, its norm layers, its state.

``prepare_`` swaps the GEMM layers; the recipes of the literature also change the update and the batch norm:

- ``unified-int8`` (Zhu et al. CVPR 2020, Sec. 4.2, Eq. 10): deviation-counteractive learning-rate scaling
  (DCLR): one parameter group per converted layer, whose lr is set to ``base_lr * max(exp(-alpha d), beta)``
  from the layer's last DSGC deviation ``d`` before every optimizer step (``dclr=False`` turns it off).
- ``wageubn`` (Yang et al. 2020): :class:`inttrain.recipes.WageubnSGD` (8-bit G, 16-bit momentum, 24-bit
  update/weights) replaces SGD, and every ``BatchNorm2d`` becomes
  :class:`inttrain.nn.quant_bn.QuantBatchNorm2d` (8-bit BN).  Only SGD is defined by the paper: other
  optimizers are refused.
- ``sbm`` (Banner et al. 2018, Sec. 4): every ``BatchNorm2d`` becomes
  :class:`inttrain.nn.range_bn.RangeBatchNorm2d` (Range BN).

State that decides how training continues and lives outside the model's ``state_dict`` and the optimizer's
(the DSGC clip ratio, search counter and deviation of every ``unified-int8`` layer) is gathered by
:func:`layer_hook_state` and put back by :func:`load_layer_hook_state`; the trainer stores it in checkpoints.
Everything else is already covered: layer call counters (stochastic-rounding seeds) by
:mod:`inttrain.trainer.rng`, WageubnSGD's step counter by its own ``state_dict``, DoReFa and sbm hold no state
beyond them, and the swapped BN layers keep ``BatchNorm2d``'s parameters and buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["recipe_config", "swap_norms_", "build_recipe_optimizer", "layer_hook_state", "load_layer_hook_state"]


def recipe_config(recipe: Any) -> Any:
    """The recipe config object for a name or config; None for the trainer's float recipes (fp32, bf16)."""
    from .recipes import FLOAT_RECIPES

    if recipe is None or (isinstance(recipe, str) and recipe in FLOAT_RECIPES):
        return None
    import inttrain

    return inttrain.get_config(recipe)


def swap_norms_(model: nn.Module, recipe: Any) -> nn.Module:
    """Replace ``model``'s BatchNorm2d layers by the recipe's own (wageubn: 8-bit BN, sbm: Range BN), in place."""
    from inttrain.recipes import SbmConfig, WageubnConfig

    cfg = recipe_config(recipe)
    if isinstance(cfg, WageubnConfig):
        from inttrain.nn.quant_bn import use_quant_bn_

        use_quant_bn_(model)
    elif isinstance(cfg, SbmConfig):
        from inttrain.nn.range_bn import use_range_bn_

        use_range_bn_(model)
    return model


def build_recipe_optimizer(
    model: nn.Module, recipe: Any, optimizer: str, lr: float, dclr: bool = True, *,
    momentum: float = 0.9, weight_decay: float = 0.0, nesterov: bool = False,
) -> tuple[torch.optim.Optimizer, Callable[[], None] | None]:
    """(optimizer, hook to call right before every ``optimizer.step()`` or None) for ``recipe``.

    ``optimizer`` is the trainer's name (sgd, adam, adamw); ``model`` must already be prepared (the
    ``unified-int8`` groups are found from its converted layers).  The first parameter group always has the
    base ``lr`` (the one the trainer logs).  ``momentum``, ``weight_decay``, ``nesterov``: as
    :func:`inttrain.trainer.loop.build_optimizer`; ``wageubn``'s WageubnSGD takes momentum and weight decay
    and refuses nesterov.
    """
    from inttrain.recipes import UnifiedInt8Config, WageubnConfig

    from .loop import build_optimizer, check_optimizer_options

    cfg = recipe_config(recipe)
    options = dict(momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    if isinstance(cfg, WageubnConfig):
        if optimizer != "sgd":
            raise ValueError(f"recipe 'wageubn' trains with its quantized SGD (WageubnSGD); optimizer {optimizer!r} "
                             "is not allowed: use sgd")
        check_optimizer_options(optimizer, momentum, weight_decay)
        if nesterov:
            raise ValueError("recipe 'wageubn' trains with its quantized SGD (WageubnSGD), which has no nesterov "
                             "momentum: use --no-nesterov")
        return cfg.optimizer(model.parameters(), lr, momentum=momentum, weight_decay=weight_decay), None
    if isinstance(cfg, UnifiedInt8Config) and dclr:
        from inttrain.recipes.unified_int8 import DeviationCounteractiveLR, dclr_param_groups

        groups = dclr_param_groups(model)
        groups.sort(key=lambda g: "dsgc" in g)  # the unscaled rest first (stable: layer order kept)
        if not any("dsgc" in g for g in groups):
            return build_optimizer(optimizer, model.parameters(), lr, **options), None
        opt = build_optimizer(optimizer, groups, lr, **options)
        return opt, DeviationCounteractiveLR(opt, cfg.alpha, cfg.beta).step
    return build_optimizer(optimizer, model.parameters(), lr, **options), None


def layer_hook_state(model: nn.Module) -> dict[str, dict[str, Any]]:
    """``state_dict()`` of every layer's recipe hooks that have one (by module name; plain values only)."""
    return {name: m.hooks.state_dict() for name, m in model.named_modules()
            if callable(getattr(getattr(m, "hooks", None), "state_dict", None))}


def load_layer_hook_state(model: nn.Module, state: dict[str, dict[str, Any]]) -> None:
    """Put back what :func:`layer_hook_state` saved; ValueError if the model lacks a saved layer."""
    modules = dict(model.named_modules())
    missing = sorted(n for n in state if not callable(getattr(getattr(modules.get(n), "hooks", None), "load_state_dict", None)))
    if missing:
        raise ValueError(f"checkpoint has recipe layer state for layers the model lacks: {', '.join(missing)}")
    for name, value in state.items():
        modules[name].hooks.load_state_dict(value)
