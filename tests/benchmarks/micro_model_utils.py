"""Small inttrain.micro model descriptions the integer-only benchmark scripts' tests share."""

from __future__ import annotations

C = lambda i, o, s=1: {"type": "conv2d", "in_channels": i, "out_channels": o, "kernel_size": 3, "stride": s,  # noqa: E731
                       "padding": 1}
BN = {"type": "batchnorm", "num_features": 8, "gain_shift": 3}
#: conv, batch norm, one residual block, global pool and a classifier on 3x8x8 inputs, 4 classes
RESIDUAL_BN = {"input_shape": [3, 8, 8], "seed": 0, "layers": [
    C(3, 8), BN, {"type": "relu"}, {"type": "residual", "layers": [C(8, 8), BN, {"type": "relu"}, C(8, 8), BN]},
    {"type": "relu"}, {"type": "globalavgpool2d"}, {"type": "flatten"},
    {"type": "linear", "in_features": 8, "out_features": 4}]}
