"""Int8 max-pool of channels-last codes at any spatial size (issue 15: lenet5 --dataflow crashed on 28x28).

torch 2.13's uint8 channels-last max-pool kernel rejects inputs of 14x14 and larger; the dataflow op
pools NCHW-contiguous codes instead and must stay exact: forward values and input gradient equal to
float max-pool on the dequantized input, bit for bit, with the input's memory layout kept.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inttrain.autograd.qactivation import QActivation, quantize_activation


class _Attach(torch.autograd.Function):
    """A QActivation with a float leaf behind it, so its gradient can be read."""

    @staticmethod
    def forward(ctx, leaf, q):
        return QActivation(q.codes, q.scale, q.zero_point, q.bits)

    @staticmethod
    def backward(ctx, g):
        return g, None


@pytest.mark.parametrize("size", [8, 14, 28, 32, 33])
@pytest.mark.parametrize("channels_last", [False, True])
def test_max_pool_of_codes_is_exact_at_any_size(size: int, channels_last: bool) -> None:
    g = torch.Generator().manual_seed(size)
    q = quantize_activation(torch.randn(3, 6, size, size, generator=g))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    q = QActivation(q.codes.contiguous(memory_format=fmt), q.scale, q.zero_point, q.bits)
    leaf = torch.zeros(q.shape, requires_grad=True)
    out_q = F.max_pool2d(_Attach.apply(leaf, q), 2)
    assert isinstance(out_q, QActivation)
    assert out_q.codes.is_contiguous(memory_format=fmt)
    xf = q.dequantize().clone().requires_grad_()
    out_f = F.max_pool2d(xf, 2)
    dy = torch.randn(out_f.shape, generator=g)
    out_q.backward(dy)
    out_f.backward(dy)
    assert torch.equal(out_q.dequantize(), out_f.detach())
    assert torch.equal(leaf.grad, xf.grad)
