"""Recipes: one frozen config dataclass per method, looked up by name.

Baselines: ``fp32``, ``int8`` / ``int8-mixed``.  From the literature: ``dorefa`` (Zhou et al. 2016),
``unified-int8`` (Zhu et al. CVPR 2020), ``sbm`` (Banner et al. NeurIPS 2018).  ``bf16`` is not a
``prepare_`` recipe: it is float training under ``torch.autocast`` and is served by the trainer
(``inttrain.trainer.recipes``), which leaves the layers untouched.
"""

from __future__ import annotations

from .base import LayerHooks, RecipeConfig
from .dorefa import DoReFaConfig
from .fp32 import Fp32Config
from .int8_mixed import Int8MixedConfig
from .sbm import SbmConfig
from .unified_int8 import UnifiedInt8Config

__all__ = ["RecipeConfig", "LayerHooks", "Fp32Config", "Int8MixedConfig", "DoReFaConfig", "UnifiedInt8Config", "SbmConfig", "RECIPES", "from_name"]

RECIPES: dict[str, type[RecipeConfig]] = {
    "fp32": Fp32Config,
    "int8": Int8MixedConfig,
    "int8-mixed": Int8MixedConfig,
    "dorefa": DoReFaConfig,
    "unified-int8": UnifiedInt8Config,
    "sbm": SbmConfig,
}


def from_name(name: str, **overrides) -> RecipeConfig:
    """The config of recipe ``name`` with its defaults (``overrides`` replace fields)."""
    try:
        cls = RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; allowed: {', '.join(RECIPES)}") from None
    return cls(**overrides)
