"""The trainer's optimizers by name (sgd, adam, adamw) and the options that apply to each.

Recipes build their optimizers with these (:meth:`inttrain.recipes.RecipeConfig.optimizer_for`), so the
trainer, the CLI and a plain PyTorch loop get the same optimizer for the same settings.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["OPTIMIZER_NAMES", "DEFAULT_MOMENTUM", "check_optimizer_options", "build_optimizer"]

OPTIMIZER_NAMES: tuple[str, ...] = ("sgd", "adam", "adamw")
DEFAULT_MOMENTUM = 0.9


def check_optimizer_options(name: str, momentum: float = DEFAULT_MOMENTUM, weight_decay: float = 0.0,
                            nesterov: bool = False) -> None:
    """ValueError naming the option if ``momentum``/``weight_decay``/``nesterov`` do not apply to optimizer ``name``.

    momentum and nesterov are SGD's (adam/adamw have betas instead): a non-default value there would be
    silently ignored, so it is refused.
    """
    if name not in OPTIMIZER_NAMES:
        raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZER_NAMES)}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum={momentum}: allowed 0 <= momentum < 1")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay={weight_decay}: allowed >= 0")
    if name != "sgd" and (nesterov or momentum != DEFAULT_MOMENTUM):
        what = "nesterov" if nesterov else f"momentum={momentum}"
        raise ValueError(f"{what} applies to sgd only; optimizer {name!r} uses its betas (leave momentum at "
                         f"{DEFAULT_MOMENTUM} and nesterov off, or use sgd)")
    if nesterov and momentum == 0:
        raise ValueError("nesterov needs momentum > 0 (got momentum=0)")


def build_optimizer(name: str, params: Any, lr: float, momentum: float = DEFAULT_MOMENTUM, weight_decay: float = 0.0,
                    nesterov: bool = False) -> torch.optim.Optimizer:
    """Optimizer ``name`` (sgd, adam, adamw) over ``params`` (tensors or parameter groups)."""
    check_optimizer_options(name, momentum, weight_decay, nesterov)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
