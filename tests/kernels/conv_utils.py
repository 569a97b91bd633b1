"""Checks the native convolution tests share (imported by module name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import torch

from inttrain.kernels import conv as K
from inttrain.kernels import conv_reference as R
from inttrain.kernels.conv_geometry import ConvGeometry

ONE = torch.ones(1)


def forward_and_input_grad_exact(xq: torch.Tensor, wq: torch.Tensor, stride: int) -> None:
    """kernels.conv's forward and input gradient (a sub-pixel convolution) of 3x3 codes, padding 1, equal the
    int64 reference bit for bit."""
    geom = ConvGeometry((stride, stride), (1, 1), (1, 1), 1)
    y = K.conv2d_forward(xq, ONE, wq, ONE, geom)
    assert torch.equal(y, R.conv2d_forward(xq, ONE, wq, ONE, geom))
    g = torch.randint(-128, 128, tuple(y.shape), dtype=torch.int16).to(torch.int8)
    dx = K.conv2d_input_grad(g, ONE, wq, ONE, tuple(xq.shape), geom)
    assert torch.equal(dx, R.conv2d_input_grad(g, ONE, wq, ONE, tuple(xq.shape), geom))
