"""Recipes: one frozen config dataclass per method, looked up by name."""

from __future__ import annotations

from .base import RecipeConfig
from .fp32 import Fp32Config
from .int8_mixed import Int8MixedConfig

__all__ = ["RecipeConfig", "Fp32Config", "Int8MixedConfig", "RECIPES", "from_name"]

RECIPES: dict[str, type[RecipeConfig]] = {
    "fp32": Fp32Config,
    "int8": Int8MixedConfig,
    "int8-mixed": Int8MixedConfig,
}


def from_name(name: str, **overrides) -> RecipeConfig:
    """The config of recipe ``name`` with its defaults (``overrides`` replace fields)."""
    try:
        cls = RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; allowed: {', '.join(sorted(RECIPES))}") from None
    return cls(**overrides)
