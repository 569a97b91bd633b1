"""inttrain: train neural networks in integer arithmetic.

>>> import inttrain
>>> # inttrain.prepare_(model, "int8")  # swap Linear/Conv2d for int8-training layers, in place
>>> # inttrain.conversion_report(model)  # what runs on integer kernels, what stayed float and why
>>> # model = inttrain.load("runs/NAME")  # a trained run's model back (recipe applied, eval mode)

Heavy submodules are imported lazily so that ``import inttrain`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "prepare_": "inttrain.api",
    "restore_": "inttrain.api",
    "get_config": "inttrain.api",
    "recipe_names": "inttrain.api",
    "conversion_report": "inttrain.api",
    "FloatFallbackWarning": "inttrain.report",
    "load": "inttrain.cli.load",
    "QLinear": "inttrain.nn",
    "QConv2d": "inttrain.nn",
    "quantize": "inttrain.numerics",
    "dequantize": "inttrain.numerics",
    "QTensor": "inttrain.numerics",
    "sqnr_db": "inttrain.numerics",
}

_SUBMODULES = ("spec", "numerics", "kernels", "autograd", "nn", "recipes", "models", "data", "trainer")

__all__ = ["__version__", *_LAZY, *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"inttrain.{name}")
    raise AttributeError(f"module 'inttrain' has no attribute {name!r}")
