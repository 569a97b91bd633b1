"""Convolutions with 9..16-bit codes: int16 codes split into exact int8 halves (as Linear layers do) give the
int64 reference's result bit for bit, in all three convolutions, and a QConv2d trains at those widths."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import inttrain
from inttrain.kernels import conv_generic, conv_reference, int_kernel_calls, reset_kernel_calls
from inttrain.kernels.conv_geometry import ConvGeometry
from inttrain.recipes import Int8MixedConfig

GEOMS = [ConvGeometry((1, 1), (1, 1), (1, 1), 1), ConvGeometry((2, 2), (1, 0), (1, 2), 2)]


def _codes(bits: int, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    hi = 2 ** (bits - 1) - 1
    q = torch.randint(-hi, hi + 1, shape, generator=g)
    q.view(-1)[0] = -hi  # the extremes, so the widest products are in every test
    q.view(-1)[-1] = hi
    return q.to(torch.int16 if bits > 8 else torch.int8)


@pytest.mark.parametrize("geom", GEOMS)
@pytest.mark.parametrize("bits_a,bits_b", [(12, 8), (8, 16), (16, 16)])
def test_wide_forward_and_input_grad_equal_the_int64_reference(geom: ConvGeometry, bits_a: int, bits_b: int) -> None:
    g = torch.Generator().manual_seed(bits_a * 100 + bits_b)
    x = _codes(bits_a, (2, 4, 7, 6), g)
    w = _codes(bits_b, (6, 4 // geom.groups, 3, 3), g)
    sx, sw = torch.tensor([0.01]), torch.rand(6, generator=g) + 0.1
    y = conv_generic.conv2d_forward(x, sx, w, sw, geom)
    assert torch.equal(y.contiguous(), conv_reference.conv2d_forward(x, sx, w, sw, geom))
    dy = _codes(bits_a, tuple(y.shape), g)
    sw_in = torch.rand(4, generator=g) + 0.1
    dx = conv_generic.conv2d_input_grad(dy, sx, w, sw_in, tuple(x.shape), geom)
    assert torch.equal(dx.contiguous(), conv_reference.conv2d_input_grad(dy, sx, w, sw_in, tuple(x.shape), geom))


@pytest.mark.parametrize("geom", GEOMS)
@pytest.mark.parametrize("bits_g,bits_x", [(12, 8), (16, 12), (16, 16)])
def test_wide_weight_gradient_equals_the_int64_reference(geom: ConvGeometry, bits_g: int, bits_x: int) -> None:
    g = torch.Generator().manual_seed(bits_g * 100 + bits_x)
    x = _codes(bits_x, (2, 4, 7, 6), g)
    w_shape = (6, 4 // geom.groups, 3, 3)
    ho = (7 + 2 * geom.padding[0] - geom.dilation[0] * 2 - 1) // geom.stride[0] + 1
    wo = (6 + 2 * geom.padding[1] - geom.dilation[1] * 2 - 1) // geom.stride[1] + 1
    dy = _codes(bits_g, (2, 6, ho, wo), g)
    sg, sx = torch.rand(6, generator=g) + 0.1, torch.tensor([0.02])
    ours = conv_generic.conv2d_weight_grad(dy, sg, x, sx, w_shape, geom)
    assert torch.equal(ours.contiguous(), conv_reference.conv2d_weight_grad(dy, sg, x, sx, w_shape, geom))


@pytest.mark.parametrize("bits,bound", [(8, 2e-2), (12, 1.5e-3), (16, 1e-4)])
def test_qconv2d_trains_at_wide_bit_widths(bits: int, bound: float) -> None:
    """Output, input gradient and weight gradient approach float32 as the codes widen (~2^-bits)."""
    torch.manual_seed(0)
    conv, ref = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 3, padding=1)
    ref.load_state_dict(conv.state_dict())
    x = torch.randn(4, 3, 8, 8, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    inttrain.prepare_(conv, Int8MixedConfig(bits=bits))
    reset_kernel_calls()
    y = conv(x)
    y.square().sum().backward()
    assert sum(int_kernel_calls().values()) >= 3  # the three convolutions ran on integer kernels
    r = ref(xr)
    r.square().sum().backward()
    rel = lambda a, b: float((a - b).detach().norm() / b.detach().norm())  # noqa: E731
    assert rel(y, r) < bound and rel(x.grad, xr.grad) < 2 * bound and rel(conv.weight.grad, ref.weight.grad) < 2 * bound
