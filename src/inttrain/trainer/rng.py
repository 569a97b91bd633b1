"""Capture and restore everything random a training step depends on.

Bit-identical resume needs the global torch / numpy / python RNGs and the
integer layers' ``calls`` counters (they seed stochastic rounding). States are
stored as plain containers + tensors so ``torch.load(weights_only=True)``
accepts them.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["capture_rng", "restore_rng", "layer_calls", "set_layer_calls"]


def capture_rng() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, pystate, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": version, "state": list(pystate), "gauss_next": gauss_next},
    }


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


def layer_calls(model: nn.Module) -> dict[str, int]:
    """``calls`` of every module that has one, by module name."""
    return {name: int(m.calls) for name, m in model.named_modules() if isinstance(getattr(m, "calls", None), int)}


def set_layer_calls(model: nn.Module, calls: dict[str, int]) -> None:
    modules = dict(model.named_modules())
    missing = sorted(set(calls) - set(modules))
    if missing:
        raise ValueError(f"checkpoint has call counters for layers the model lacks: {', '.join(missing)}")
    for name, value in calls.items():
        modules[name].calls = int(value)
