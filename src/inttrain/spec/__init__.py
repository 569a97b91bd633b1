"""Integer formats, granularities, rounding modes and per-GEMM precision (pure Python, stdlib only)."""

from .formats import (
    MAX_BITS,
    MIN_BITS,
    PER_COLUMN,
    PER_ROW,
    PER_TENSOR,
    Granularity,
    IntFormat,
    Overflow,
    PerBlock,
    PerChannel,
    PerTensor,
    QuantSpec,
    Rounding,
    ScaleKind,
    UnsupportedFormatError,
)
from .errors import CheckpointError, ConfigError, DataError, InttrainError, LimitError, ModelFormatError
from .precision import GemmPrecision, LayerPrecision

__all__ = [
    "MAX_BITS", "MIN_BITS", "PER_COLUMN", "PER_ROW", "PER_TENSOR", "Granularity", "IntFormat", "Overflow",
    "PerBlock", "PerChannel", "PerTensor", "QuantSpec", "Rounding", "ScaleKind", "UnsupportedFormatError",
    "GemmPrecision", "LayerPrecision",
    "InttrainError", "DataError", "ConfigError", "CheckpointError", "ModelFormatError", "LimitError",
]
