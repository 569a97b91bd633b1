"""Quantize / dequantize, scale choice, counter-based stochastic rounding and error metrics (torch)."""

from .hashing import SeedPurpose, derive_seed, mix_seed, uniform_from_counter
from .metrics import cosine_deviation, sqnr_db
from .qtensor import QTensor
from .quantize import (
    NonFiniteError,
    absmax,
    check_finite,
    dequantize,
    fake_quantize,
    quantize,
    round_and_clamp,
    scale_from_amax,
    storage_dtype,
)

__all__ = [
    "QTensor", "NonFiniteError", "absmax", "check_finite", "dequantize", "fake_quantize", "quantize",
    "round_and_clamp", "scale_from_amax", "storage_dtype", "mix_seed", "derive_seed", "SeedPurpose", "uniform_from_counter",
    "cosine_deviation", "sqnr_db",
]
