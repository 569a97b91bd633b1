"""The training forward under ``torch.compile``: one graph for forward and backward, with a clean fallback.

Integer layers are graph nodes (:mod:`inttrain.kernels.ops`), so Inductor fuses the quantize / dequantize /
bias / ReLU work around them; measured in ``benchmarks/speed.py`` this is the fastest way to run int8 layers.
Compilation happens on the first step (reported with its time); if it fails — no C++ compiler, a model or
recipe dynamo cannot trace — the run continues eagerly after one message.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["CompiledForward", "auto_compile"]


def auto_compile(converts_layers: bool, distributed: bool, graph_friendly: bool = True) -> tuple[bool, str]:
    """Whether ``inttrain train`` compiles by default, and why (the default follows what measured fastest).

    Integer layers compile, int8 dataflow included (measured 1.3-1.4x faster than their eager step on the
    MLP and ResNet-20 rows of benchmarks/speed.py); float recipes gain little; recipes whose per-layer hooks
    break the graph (``graph_friendly=False``: :meth:`inttrain.recipes.RecipeConfig.compiles`) and data-parallel
    runs do not compile.  ``INTTRAIN_COMPILE=0`` in the environment turns it off.
    """
    if os.environ.get("INTTRAIN_COMPILE", "1") in ("0", "false", "no"):
        return False, "INTTRAIN_COMPILE=0"
    if not converts_layers:
        return False, "float recipe"
    if not graph_friendly:
        return False, "the recipe's per-layer hooks break the graph"
    if distributed:
        return False, "data-parallel runs do not compile yet"
    return True, "integer layers"


class CompiledForward:
    """``model(x)`` through ``torch.compile(model)``; eager from the first failure on (one logged message).

    ``eager_calls``: run this many first calls eagerly (a BitOPs counter learns the step's GEMMs from
    an eager step, then counts compiled ones by replay: :class:`inttrain.cost.BitOpsCounter`).
    """

    def __init__(self, model: nn.Module, log: Callable[[str], Any], eager_calls: int = 0) -> None:
        self.model, self.log = model, log
        self.compiled = torch.compile(model)
        self.failed = False
        self.first = True
        self.eager_calls = eager_calls
        # (start of the first compiled call, seconds its forward graph took): the backward graph compiles during
        # the first backward, so the whole first step is reported when the next call arrives.
        self.first_step: tuple[float, float] | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.failed:
            return self.model(x)
        if self.eager_calls > 0:
            self.eager_calls -= 1
            return self.model(x)
        if not self.first:
            if self.first_step is not None:
                t0, forward_s = self.first_step
                self.first_step = None
                total = time.perf_counter() - t0
                self.log(f"torch.compile: first step took {total:.1f} s (forward graph {forward_s:.1f} s, backward "
                         f"graph and the step {total - forward_s:.1f} s)")
            return self.compiled(x)
        t0 = time.perf_counter()
        try:
            out = self.compiled(x)
        except Exception as exc:  # dynamo / inductor / C++ toolchain errors: train eagerly instead
            self.failed = True
            reason = (str(exc).strip().splitlines() or [""])[0][:200]
            self.log(f"torch.compile failed ({type(exc).__name__}: {reason}); training eagerly (--no-compile to skip)")
            return self.model(x)
        self.first = False
        forward_s = time.perf_counter() - t0
        self.first_step = (t0, forward_s)
        self.log(f"torch.compile: forward graph built in {forward_s:.1f} s (backward compiles on the first "
                 "backward)")
        return out
