"""The one entry point: ``prepare_(model, config_or_name)`` converts a model in place; ``restore_`` undoes it.

>>> import torch, inttrain
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
>>> _ = inttrain.prepare_(model, "int8")
>>> type(model[0]).__name__
'QLinear'
>>> _ = inttrain.restore_(model)
>>> type(model[0]).__name__
'Linear'
"""

from __future__ import annotations

import logging
import warnings
from typing import Callable

from torch import nn

from .nn import IntLayerMixin, QConv2d, QLinear, restore_module
from .nn.layers import MaskReLU
from .nn.hf_conv1d import is_hf_conv1d, qconv1d_class
from .recipes import RECIPES, RecipeConfig, from_name
from .report import ConversionReport, FloatFallbackWarning, float_reason

__all__ = ["prepare_", "restore_", "get_config", "recipe_names", "conversion_report", "FloatFallbackWarning",
           "ConversionReport"]

log = logging.getLogger("inttrain")

FilterFn = Callable[[nn.Module, str], bool]


def recipe_names() -> list[str]:
    """Recipe names in registration order: the baselines (fp32, int8) first, then the literature's recipes."""
    return list(RECIPES)


def get_config(config: RecipeConfig | str) -> RecipeConfig:
    """A config object from a config or a recipe name (ValueError listing the names otherwise)."""
    if isinstance(config, RecipeConfig):
        return config
    if isinstance(config, str):
        return from_name(config)
    raise TypeError(f"expected a recipe name or a RecipeConfig, got {type(config).__name__}")


def _unsupported_reason(module: nn.Module) -> str | None:
    """Why the integer kernels cannot serve this Linear/Conv2d/Conv1D as it is, or None if they can."""
    if type(module) is nn.Linear:
        return "empty layer" if module.in_features == 0 or module.out_features == 0 else None
    if type(module) is nn.Conv2d:
        if module.padding_mode != "zeros":
            return f"padding_mode={module.padding_mode!r} (only zero padding)"
        if isinstance(module.padding, str):
            return f"padding={module.padding!r} (give padding as numbers)"
        return None
    if is_hf_conv1d(module):
        return "empty layer" if 0 in module.weight.shape else None
    return float_reason(module)


def _layer_class(module: nn.Module) -> type | None:
    """The integer class that replaces ``module``, or None when ``module`` is no convertible GEMM layer."""
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        return QLinear if isinstance(module, nn.Linear) else QConv2d
    return qconv1d_class(type(module)) if is_hf_conv1d(module) else None


def prepare_(model: nn.Module, config: RecipeConfig | str = "int8", filter_fn: FilterFn | None = None,
             dataflow: bool = False) -> nn.Module:
    """Convert every ``nn.Linear`` / ``nn.Conv2d`` (and transformers' GPT-2 ``Conv1D``) of ``model`` in place.

    Args:
        model: any module (the root itself may be a Linear/Conv2d).
        config: a recipe config object or a name such as ``"int8"`` (see :func:`recipe_names`).
        filter_fn: ``(module, fully_qualified_name) -> bool``; layers for which it returns False stay float.
        dataflow: integer convolutions and Linear layers (all but the last Linear, the head, whose logits
            stay float) hand their outputs on as int8 ``QActivation`` tensors, and the ops
            after them (batch norm, ReLU, pooling, flatten, dropout, the residual add) run on int8 and
            save int8 for backward; an op without an int8 version runs in float on the dequantized
            values and is logged once (see :mod:`inttrain.autograd.dataflow`).

    Layers with weights that no integer kernel serves (string padding, non-zero padding modes, Linear/Conv2d
    subclasses such as ``nn.MultiheadAttention``'s projection, ``Conv1d``, ``LSTM``...) stay in float, and
    each one raises a :class:`FloatFallbackWarning` naming the layer and why; layers left in float on
    purpose (``filter_fn``, the recipe's own choice) are only logged.  The table of
    :func:`conversion_report` (converted / left in float, per type) is logged on the ``inttrain`` logger.
    The recipe's own BatchNorm is installed too (``sbm``: Range BN, ``wageubn``: 8-bit BN; see
    :meth:`inttrain.recipes.RecipeConfig.convert_norms_`); its optimizer and per-step hook come from
    :meth:`~inttrain.recipes.RecipeConfig.optimizer_for` and :meth:`~inttrain.recipes.RecipeConfig.step_hook`.
    Parameters are not copied: optimizers built before or after ``prepare_`` see the same tensors, and
    ``state_dict()`` keys do not change.  Returns ``model``.
    """
    cfg = get_config(config)
    if not cfg.converts_layers():
        return model
    last_linear = None
    recipe_filter = cfg.layer_filter(model)
    for layer_id, (fqn, module) in enumerate(model.named_modules()):
        if isinstance(module, IntLayerMixin):
            restore_module(module)  # re-preparing replaces the old precision
        if type(module) is nn.ReLU:  # compiled graphs save its mask as int8 (see inttrain.autograd.relu)
            module.__class__ = MaskReLU
            continue
        reason = _unsupported_reason(module)
        if reason is not None:
            if reason != "not a GEMM layer":
                warnings.warn(f"inttrain: {fqn or '<root>'} ({type(module).__name__}) stays in float: {reason}",
                              FloatFallbackWarning, stacklevel=2)
            continue
        if filter_fn is not None and not filter_fn(module, fqn):
            reason = "excluded by filter_fn"
        if reason is None and recipe_filter is not None and not recipe_filter(module, fqn):
            reason = f"kept in float by recipe {cfg.name!r}"
        precision = cfg.precision_for(module, fqn or type(module).__name__) if reason is None else None
        if reason is None and precision is None:
            reason = f"left in float by recipe {cfg.name!r}"
        if reason is not None:
            log.info("inttrain: kept %s (%s) in float: %s", fqn or "<root>", type(module).__name__, reason)
            continue
        layer_cls = _layer_class(module)
        layer_cls.convert(module, precision, seed=cfg.seed, layer_id=layer_id)
        if dataflow:
            module.dataflow = True
            last_linear = module if layer_cls is not QConv2d else last_linear
        hooks = cfg.hooks_for(module, fqn)
        if hooks is not None:
            module.hooks = hooks
    if last_linear is not None:  # the model's head: its logits go to the loss in float
        last_linear.dataflow = False
    cfg.convert_norms_(model)
    log.info("inttrain: recipe %s\n%s", cfg.name, conversion_report(model).table())
    return model


def conversion_report(model: nn.Module) -> ConversionReport:
    """What runs on integer kernels in ``model`` now: converted layers and layers with weights left in float.

    >>> import torch, inttrain
    >>> m = inttrain.prepare_(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)), "int8")
    >>> inttrain.conversion_report(m).converted
    {'Linear': 2}
    """
    converted: dict[str, int] = {}
    left: list[tuple[str, str, str]] = []
    for fqn, module in model.named_modules():
        if isinstance(module, IntLayerMixin):
            name = module.float_class.__name__
            converted[name] = converted.get(name, 0) + 1
            continue
        reason = _unsupported_reason(module)
        if reason == "not a GEMM layer":
            continue
        left.append((fqn or "<root>", type(module).__name__, reason or "excluded by filter_fn or the recipe"))
    return ConversionReport(converted, left)


def restore_(model: nn.Module) -> nn.Module:
    """Turn every integer layer (and recipe BatchNorm) of ``model`` back into its plain torch class, in place.

    Returns ``model``.
    """
    from .nn.quant_bn import QuantBatchNorm2d
    from .nn.range_bn import RangeBatchNorm2d

    for module in model.modules():
        restore_module(module)
        if type(module) in (RangeBatchNorm2d, QuantBatchNorm2d):  # swapped in place by convert_norms_
            module.__class__ = nn.BatchNorm2d
            module.__dict__.pop("bits", None)  # QuantBatchNorm2d's width, set by use_quant_bn_
    return model
