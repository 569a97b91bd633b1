"""inttrain.integer_only: the PyTorch twin of the NumPy integer-only engine :mod:`inttrain.micro`.

Same arithmetic (docs/integer-training.md), bit for bit: int8 codes with power-of-two exponents,
exact int32 GEMMs on :func:`inttrain.kernels.matmul.int_mm` (``torch._int_mm``), rounding shifts,
the Q15 exp2-table softmax cross-entropy gradient and integer SGD, all as torch integer ops (a
training step creates no floating-point tensor). Models come from micro's description and initial
weights, so both engines train identically from the same data order.

>>> from inttrain.integer_only import Sequential, SGD, train_epoch
>>> model = Sequential.from_description({"input_shape": [64], "layers": [
...     {"type": "linear", "in_features": 64, "out_features": 10}]})
"""

from __future__ import annotations

from .layers import AvgPool2d, BatchNorm, Conv2d, Flatten, Linear, MaxPool2d, Param, ReLU, Residual, add_aligned
from .loss import EXP2_LUT, softmax_cross_entropy_grad, softmax_q7
from .model import Sequential, StepResult, evaluate, predict, train_epoch, train_step
from .ops import IntTensor, requantize, saturate, shift, shift_round
from .optim import SGD

__all__ = [
    "AvgPool2d", "BatchNorm", "Residual", "add_aligned", "Conv2d", "Flatten", "Linear", "MaxPool2d", "Param", "ReLU", "EXP2_LUT", "softmax_cross_entropy_grad",
    "softmax_q7", "Sequential", "StepResult", "evaluate", "predict", "train_epoch", "train_step", "IntTensor",
    "requantize", "saturate", "shift", "shift_round", "SGD",
]
