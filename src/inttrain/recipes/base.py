"""What every recipe provides: one frozen config object that owns the recipe's whole behaviour.

A recipe config says how a model is converted (:meth:`RecipeConfig.precision_for`, :meth:`~RecipeConfig.hooks_for`,
:meth:`~RecipeConfig.layer_filter`, :meth:`~RecipeConfig.convert_norms_`; :func:`inttrain.prepare_` calls them),
how it trains (:meth:`~RecipeConfig.autocast`, :meth:`~RecipeConfig.optimizer_for`,
:meth:`~RecipeConfig.step_hook`), what it checkpoints (:meth:`~RecipeConfig.training_state`) and what it
reports (:meth:`~RecipeConfig.report`).  The trainer and the CLI call only these, so a plain PyTorch loop
trains the same method as ``inttrain train``::

    recipe = inttrain.get_config("unified-int8")
    inttrain.prepare_(model, recipe)                  # GEMM layers and the recipe's BatchNorm
    opt = recipe.optimizer_for(model, "sgd", lr=0.1)  # the recipe's optimizer (or its parameter groups)
    before_step = recipe.step_hook(opt)               # e.g. DCLR's per-layer lr scaling
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        before_step()
        opt.step()

Adding a recipe = one file with a subclass, registered in :data:`inttrain.recipes.RECIPES`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ..optim import DEFAULT_MOMENTUM, build_optimizer
from ..spec import LayerPrecision, Rounding

__all__ = ["RecipeConfig", "LayerHooks", "BASE_LR_KEY", "no_step_hook", "layer_hook_state", "load_layer_hook_state",
           "first_last_filter"]

#: Parameter-group key holding the lr a recipe's step hook scales per group (set it, not ``lr``, to change
#: the base of such a group: the trainer's lr schedule does).  The name is the one checkpoints already hold.
BASE_LR_KEY = "dclr_base_lr"


class LayerHooks:
    """Per-layer recipe state attached by :func:`inttrain.prepare_` (``layer.hooks``); identity by default.

    ``forward_operands`` returns the (float, differentiable) input and weight handed to the integer GEMMs;
    ``grad_output(dy, seed)`` transforms the float output gradient in backward before it is quantized.
    """

    def forward_operands(self, layer: nn.Module, x: torch.Tensor, weight: torch.Tensor):
        return x, weight

    def grad_output(self, dy: torch.Tensor, seed: int) -> torch.Tensor:
        return dy


def no_step_hook() -> None:
    """The step hook of a recipe that does nothing around the optimizer step."""


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


@dataclass(frozen=True)
class RecipeConfig:
    """Base of the frozen per-recipe configs applied by :func:`inttrain.prepare_`.

    Subclasses set ``name`` and override :meth:`precision_for`; returning ``None`` leaves a layer in float.
    Every other method has the plain behaviour as its default (no norm swap, no autocast, the named torch
    optimizer, no step hook, per-layer hook state only).
    """

    name = "base"
    #: Trainer optimizer names this recipe trains with (None: any of :data:`inttrain.optim.OPTIMIZER_NAMES`),
    #: and how its update is named in messages when that is limited.
    optimizers: ClassVar[tuple[str, ...] | None] = None
    update_rule: ClassVar[str] = "any optimizer"
    #: (paper, what runs in integer arithmetic, what stays float): what ``inttrain recipes show`` prints.
    facts: ClassVar[tuple[str, str, str]] = ("", "", "")
    seed: int = 0

    # ------------------------------------------------------------------ conversion (inttrain.prepare_)
    def precision_for(self, module: nn.Module, fqn: str) -> LayerPrecision | None:
        raise NotImplementedError

    def hooks_for(self, module: nn.Module, fqn: str) -> LayerHooks | None:
        """Per-layer transforms/state for ``module`` (None: the plain integer layer)."""
        return None

    def layer_filter(self, model: nn.Module):
        """A recipe-level ``(module, fqn) -> bool`` for ``model`` (e.g. keep first/last layer float), or None."""
        return None

    def with_first_last_float(self, keep: bool) -> RecipeConfig:
        """This config with its first/last-layer policy set (``inttrain train --first-last-float``); ValueError if
        the recipe has no such choice."""
        if "first_last_float" not in {f.name for f in dataclasses.fields(self)}:
            raise ValueError(f"recipe {self.name!r} has no first/last-layer choice; use int8 or dorefa")
        return dataclasses.replace(self, first_last_float=keep)

    def with_bf16_activations(self, on: bool) -> RecipeConfig:
        """This config with bfloat16 activations between layers on or off (``inttrain train --bf16-activations``);
        ValueError if the recipe has no such choice."""
        if "bf16_activations" not in {f.name for f in dataclasses.fields(self)}:
            raise ValueError(f"recipe {self.name!r} has no bfloat16-activation choice; use int8")
        return dataclasses.replace(self, bf16_activations=on)

    def with_per_sample_grad(self, on: bool) -> RecipeConfig:
        """This config with per-sample output-gradient scales in the convolutions' input-gradient GEMM on or off
        (``inttrain train --per-sample-grad``); ValueError if the recipe has no such choice."""
        if "per_sample_grad" not in {f.name for f in dataclasses.fields(self)}:
            raise ValueError(f"recipe {self.name!r} has no per-sample gradient scale choice; use int8 or wageubn")
        return dataclasses.replace(self, per_sample_grad=on)

    def with_range_bn(self, on: bool) -> RecipeConfig:
        """This config with Range BN on or off (``inttrain train --range-bn / --no-range-bn``); ValueError if the
        recipe has no such choice."""
        if "range_bn" not in {f.name for f in dataclasses.fields(self)}:
            raise ValueError(f"recipe {self.name!r} has no Range BN choice; use sbm")
        return dataclasses.replace(self, range_bn=on)

    def with_activation_range(self, activation_range: str) -> RecipeConfig:
        """This config with its activation range set (``inttrain train --activation-range``, dorefa's
        ``clip`` or ``max``); ValueError if the recipe has no such choice or the value is not one of its."""
        if "activation_range" not in {f.name for f in dataclasses.fields(self)}:
            raise ValueError(f"recipe {self.name!r} has no activation-range choice; use dorefa")
        return dataclasses.replace(self, activation_range=activation_range)

    def with_norm_bits(self, bits: int) -> RecipeConfig:
        """This config with its quantized batch norm's width set (``inttrain train --norm-bits``); ValueError if the
        recipe quantizes no batch norm."""
        return self._with_field("norm_bits", bits, "quantized batch norm; use wageubn")

    def with_weight_grad_bits(self, bits: int) -> RecipeConfig:
        """This config with the width of the weight gradient its optimizer quantizes set (``inttrain train
        --weight-grad-bits``); ValueError if the recipe's optimizer quantizes none."""
        return self._with_field("g_bits", bits, "quantized weight gradient; use wageubn")

    def converts_layers(self) -> bool:
        """False for float baselines (fp32, bf16), which leave the model untouched."""
        return True

    def compiles(self) -> bool:
        """Whether ``inttrain train`` compiles this recipe's step by default.  False where the recipe's per-layer
        hooks read tensors into Python state every call: each layer then becomes its own graph and the
        layers, which share one ``forward``, exhaust torch.compile's recompile limit (measured slower than eager)."""
        return self.converts_layers()

    def convert_norms_(self, model: nn.Module) -> nn.Module:
        """Swap ``model``'s BatchNorm layers for the recipe's own, in place (default: keep them)."""
        return model

    def with_bits(self, bits: int) -> RecipeConfig:
        """This config with its bit width set to ``bits`` (``inttrain train --bits``); ValueError if it has none."""
        if not self.converts_layers():
            raise ValueError(f"recipe {self.name!r} has no bit width; use an integer recipe such as int8")
        if "bits" not in {f.name for f in dataclasses.fields(self)}:
            raise ValueError(f"recipe {self.name!r} has no bits field")
        return dataclasses.replace(self, bits=bits)

    def with_weight_grad_rounding(self, rounding: Rounding) -> RecipeConfig:
        """This config with the weight-gradient GEMM's output-gradient rounding set (``inttrain train
        --weight-grad-rounding``); ValueError if the recipe has no such choice."""
        return self._with_field("weight_grad_rounding", rounding, "weight-gradient rounding choice; use int8")

    def with_grad_rounding(self, rounding: Rounding) -> RecipeConfig:
        """This config with the output-gradient rounding set (``inttrain train --grad-rounding``: the
        input-gradient GEMM's, and the weight-gradient GEMM's where the recipe sets no rounding of its own
        for it); ValueError if the recipe has no such choice."""
        return self._with_field("grad_rounding", rounding, "gradient rounding choice; use int8, sbm, unified-int8 or wageubn")

    def _with_field(self, field: str, value: Any, missing: str) -> RecipeConfig:
        if field not in {f.name for f in dataclasses.fields(self)}:
            raise ValueError(f"recipe {self.name!r} has no {missing}")
        return dataclasses.replace(self, **{field: value})

    # ------------------------------------------------------------------ training
    def autocast(self, device: str | torch.device = "cpu") -> contextlib.AbstractContextManager[Any]:
        """The context the forward pass runs in (default: none)."""
        return contextlib.nullcontext()

    def optimizer_for(self, model: nn.Module, optimizer: str = "sgd", lr: float = 0.05, *,
                      momentum: float = DEFAULT_MOMENTUM, weight_decay: float = 0.0, nesterov: bool = False,
                      lr_scaling: bool = True) -> torch.optim.Optimizer:
        """The optimizer this recipe trains the prepared ``model`` with.

        ``optimizer``: sgd, adam or adamw (:func:`inttrain.optim.build_optimizer`, with ``momentum``,
        ``weight_decay``, ``nesterov``). ``lr_scaling=False`` turns off a recipe's per-layer lr scaling.
        The first parameter group always has the base ``lr``.
        """
        return build_optimizer(optimizer, model.parameters(), lr, momentum, weight_decay, nesterov)

    def step_hook(self, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
        """What to call right before every ``optimizer.step()`` of an optimizer from :meth:`optimizer_for`."""
        return no_step_hook

    def training_state(self, model: nn.Module) -> dict[str, Any]:
        """The recipe's state of ``model`` that checkpoints need beyond its state_dict and the optimizer's."""
        return layer_hook_state(model)

    def load_training_state(self, model: nn.Module, state: dict[str, Any]) -> None:
        """Put back :meth:`training_state` (ValueError if ``model`` lacks a saved layer)."""
        load_layer_hook_state(model, state)

    def report(self, model: nn.Module) -> dict[str, float]:
        """Numbers the recipe reports about a trained ``model`` (default: none)."""
        return {}


def first_last_filter(model: nn.Module) -> Callable[[nn.Module, str], bool]:
    """The ``layer_filter`` that keeps the model's first and last Linear/Conv2d in float32 (module order, the order
    ``named_modules`` and a plain forward visit them): the first layer sees the raw input, the last one writes the
    logits.  The DoReFa paper (Zhou et al. 2016, Sec. 2.7) and most low-bit training work leave both in float."""
    layers = [m for m in model.modules() if type(m) in (nn.Linear, nn.Conv2d)]
    ends = {id(layers[0]), id(layers[-1])} if layers else set()
    return lambda module, fqn: id(module) not in ends
