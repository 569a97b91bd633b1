"""Error metrics between a reference tensor and its low-precision approximation."""

from __future__ import annotations

import math

import torch

__all__ = ["sqnr_db", "cosine_deviation"]


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio ``10 log10(sum(ref^2) / sum((ref - approx)^2))`` in dB.

    ``inf`` when the two are equal. Computed in float64 so the metric itself adds no error.
    """
    ref = reference.detach().to(torch.float64)
    err = ref - approx.detach().to(torch.float64)
    noise = float(err.pow(2).sum())
    signal = float(ref.pow(2).sum())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def cosine_deviation(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """``1 - cos(reference, approx)``: the direction deviation of Zhu et al. (CVPR 2020)."""
    a = reference.detach().to(torch.float64).flatten()
    b = approx.detach().to(torch.float64).flatten()
    denom = float(a.norm() * b.norm())
    return 1.0 if denom == 0.0 else 1.0 - float(a @ b) / denom
