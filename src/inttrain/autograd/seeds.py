"""Carrying a GEMM's stochastic-rounding seeds from forward to backward.

Eager layers pass the seeds as Python ints (``ctx`` attributes).  Compiled steps pass 0-d tensors made by
:func:`inttrain.numerics.hashing.advance_seeds`; those travel like every other tensor a backward needs,
through ``save_for_backward``, so the traced graph carries them as saved values.
"""

from __future__ import annotations

import torch

__all__ = ["save_with_seeds", "saved_and_seeds"]


def save_with_seeds(ctx, seeds: tuple, *tensors: torch.Tensor | None) -> None:
    """``ctx.save_for_backward(*tensors)``, plus the seeds (as saved tensors when they are tensors)."""
    if isinstance(seeds[0], torch.Tensor):
        ctx.seeds = None
        ctx.save_for_backward(*tensors, *seeds)
    else:
        ctx.seeds = seeds
        ctx.save_for_backward(*tensors)


def saved_and_seeds(ctx) -> tuple[list, tuple]:
    """The tensors given to :func:`save_with_seeds`, and the seeds."""
    saved = list(ctx.saved_tensors)
    if ctx.seeds is None:
        return saved[:-3], tuple(saved[-3:])
    return saved, ctx.seeds
