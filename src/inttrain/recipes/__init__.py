"""Recipes: one frozen config dataclass per method, looked up by name.

Baselines: ``fp32``, ``int8`` / ``int8-mixed``, ``bf16``.  From the literature: ``dorefa`` (Zhou et al. 2016),
``unified-int8`` (Zhu et al. CVPR 2020), ``sbm`` (Banner et al. NeurIPS 2018), ``wageubn`` (Yang et al.,
Neural Networks 2020).  ``bf16`` is float training under ``torch.autocast``: ``prepare_(model, "bf16")``
is a no-op and :meth:`Bf16Config.autocast` gives the context (the trainer opens it for the name).
"""

from __future__ import annotations

from .base import LayerHooks, RecipeConfig
from .bf16 import Bf16Config
from .dorefa import DoReFaConfig
from .fp32 import Fp32Config
from .int8_mixed import Int8MixedConfig
from .sbm import SbmConfig
from .unified_int8 import UnifiedInt8Config
from .wageubn import WageubnConfig, WageubnSGD

__all__ = ["RecipeConfig", "LayerHooks", "Fp32Config", "Int8MixedConfig", "DoReFaConfig", "UnifiedInt8Config", "SbmConfig", "Bf16Config", "WageubnConfig", "WageubnSGD", "RECIPES", "OTHER_ENGINES", "from_name"]

#: Every recipe ``prepare_`` and ``inttrain train`` run, by name: the baselines first.
RECIPES: dict[str, type[RecipeConfig]] = {
    "fp32": Fp32Config,
    "int8": Int8MixedConfig,
    "int8-mixed": Int8MixedConfig,
    "bf16": Bf16Config,
    "dorefa": DoReFaConfig,
    "unified-int8": UnifiedInt8Config,
    "sbm": SbmConfig,
    "wageubn": WageubnConfig,
}

#: Recipes with their own engine instead of float master weights and autograd (not ``prepare_`` recipes),
#: with how to train them; ``inttrain train`` refuses them with this text.
OTHER_ENGINES: dict[str, str] = {
    "integer-only": "trains integer master weights with its own integer SGD, which this trainer (float optimizers "
                    "and autograd) does not run; train it with the Python API (inttrain.recipes.integer_only.convert "
                    "+ inttrain.integer_only.train_epoch) or `python -m inttrain.micro train MODEL.json DATA.npz`, "
                    "then `inttrain export`",
}


def from_name(name: str, **overrides) -> RecipeConfig:
    """The config of recipe ``name`` with its defaults (``overrides`` replace fields)."""
    try:
        cls = RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; allowed: {', '.join(RECIPES)}") from None
    return cls(**overrides)
