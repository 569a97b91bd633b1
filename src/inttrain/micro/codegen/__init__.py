"""C code generation for micro models (no torch, no NumPy in the generated code).

``generate(model, batch_size, lr_shift)`` returns C99 sources that train ``model`` exactly as micro does
(docs/integer-training.md); ``run_check`` compiles them and compares C with micro step by step.

>>> from inttrain.micro import Sequential
>>> from inttrain.micro.codegen import generate
>>> m = Sequential.from_description({"input_shape": [4], "layers": [{"type": "linear", "in_features": 4, "out_features": 3}]})
>>> sorted(generate(m, batch_size=2, lr_shift=4).files)
['inttrain_rt.c', 'inttrain_rt.h', 'model.c', 'model.h', 'model_config.h']
"""

from __future__ import annotations

from .check import CheckResult, ToolchainError, find_cc, run_check
from .generate import GeneratedModel, generate

__all__ = ["CheckResult", "ToolchainError", "GeneratedModel", "find_cc", "generate", "run_check"]
