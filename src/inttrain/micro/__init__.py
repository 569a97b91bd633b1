"""inttrain.micro: integer-only training in a NumPy-only engine (no torch import, ever).

Storage is int8 codes with one power-of-two scale exponent per tensor (value = code * 2**exp), GEMMs
accumulate exactly in int32, rescaling is an arithmetic right shift with a defined rounding, and the
loss gradient and the SGD update are integer too. The arithmetic is specified in docs/integer-training.md.

>>> from inttrain.micro import Sequential
>>> model = Sequential.from_description({"input_shape": [64], "layers": [
...     {"type": "linear", "in_features": 64, "out_features": 10}]})
"""

from __future__ import annotations

from .errors import MicroFormatError
from .ops import IntTensor, requantize, saturate, shift_round
from .gemm import int_matmul, int_matmul_reference
from .layers import AvgPool2d, BatchNorm, Conv2d, Flatten, Linear, MaxPool2d, ReLU, Residual, add_aligned
from .loss import softmax_cross_entropy_grad
from .optim import SGD, Schedule, saturation
from .model import EpochState, Sequential, evaluate, load_data, load_model, run_epoch, save_model, train_epoch

__all__ = [
    "MicroFormatError", "IntTensor", "requantize", "saturate", "shift_round", "int_matmul",
    "int_matmul_reference", "AvgPool2d", "BatchNorm", "Residual", "add_aligned", "Conv2d", "Flatten", "Linear", "MaxPool2d", "ReLU",
    "softmax_cross_entropy_grad", "SGD", "Schedule", "saturation", "EpochState", "Sequential", "evaluate",
    "load_data", "load_model", "run_epoch", "save_model", "train_epoch",
]
