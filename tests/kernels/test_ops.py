"""The integer kernels registered as ``inttrain::`` operators: registrations pass ``torch.library.opcheck``
(schema, fake kernel, dispatch) and the operators return exactly what the eager kernels return."""

import pytest
import torch

from inttrain.kernels import conv as conv_kernels
from inttrain.kernels import conv_wide
from inttrain.kernels import int_kernel_calls, matmul, reset_kernel_calls
from inttrain.kernels.conv_geometry import ConvGeometry

GEOMS = [ConvGeometry((1, 1), (1, 1), (1, 1), 1), ConvGeometry((2, 2), (1, 1), (1, 1), 1)]


def _codes(*shape, dtype=torch.int8, lo=-128, hi=128):
    return torch.randint(lo, hi, shape, dtype=torch.int16).to(dtype)


@pytest.mark.parametrize("m,k,n", [(17, 33, 9), (64, 128, 32)])
def test_int8_mm_op_exact_and_opcheck(m, k, n):
    a, b = _codes(m, k), _codes(k, n)
    torch.library.opcheck(torch.ops.inttrain.int8_mm, (a, b))
    reset_kernel_calls()
    out = torch.ops.inttrain.int8_mm(a, b.t().contiguous().t())  # a column-major rhs, as linear's W^T view
    assert torch.equal(out.to(torch.int64), matmul.int_mm_reference(a, b))
    assert int_kernel_calls() == {"int8_mm": 1}


@pytest.mark.parametrize("geom", GEOMS, ids=["stride1", "stride2"])
def test_conv_ops_match_eager_kernels_and_opcheck(geom):
    torch.manual_seed(0)
    x = _codes(2, 8, 9, 9, dtype=torch.uint8, lo=0, hi=256).contiguous(memory_format=torch.channels_last)
    w = _codes(6, 8, 3, 3)
    sx, sw = torch.tensor([0.02]), torch.rand(6) / 50 + 0.01
    args = (x, sx, w, sw, list(geom.stride), list(geom.padding), list(geom.dilation), geom.groups)
    torch.library.opcheck(torch.ops.inttrain.conv2d_forward_u8, args)
    y = torch.ops.inttrain.conv2d_forward_u8(*args)
    assert torch.equal(y, conv_kernels.conv2d_forward_u8(x, sx, w, sw, geom))
    # bfloat16 output (a layer under bf16 autocast): the float32 result rounded, whichever kernel ran
    torch.library.opcheck(torch.ops.inttrain.conv2d_forward_u8, args, {"bf16_out": True})
    yb = torch.ops.inttrain.conv2d_forward_u8(*args, bf16_out=True)
    assert yb.dtype == torch.bfloat16 and torch.equal(yb, y.to(torch.bfloat16))

    g = _codes(*y.shape, dtype=torch.uint8, lo=0, hi=256).contiguous(memory_format=torch.channels_last)
    sg, swi = torch.tensor([0.03]), torch.rand(8) / 50 + 0.01
    dargs = (g, sg, w, swi, list(x.shape), list(geom.stride), list(geom.padding), list(geom.dilation), geom.groups)
    torch.library.opcheck(torch.ops.inttrain.conv2d_input_grad_u8, dargs)
    dx = torch.ops.inttrain.conv2d_input_grad_u8(*dargs)
    assert torch.equal(dx, conv_kernels.conv2d_input_grad_u8(g, sg, w, swi, tuple(x.shape), geom))
    torch.library.opcheck(torch.ops.inttrain.conv2d_input_grad_u8, dargs, {"bf16_out": True})
    dxb = torch.ops.inttrain.conv2d_input_grad_u8(*dargs, bf16_out=True)
    assert dxb.dtype == torch.bfloat16 and torch.equal(dxb, dx.to(torch.bfloat16))
    # the CPU graph node: the sub-pixel conv, whose depth-to-space (views, traced) gives the same dx
    torch.library.opcheck(torch.ops.inttrain.conv2d_input_grad_phases_u8, dargs)
    phases = torch.ops.inttrain.conv2d_input_grad_phases_u8(*dargs)
    assert torch.equal(conv_kernels.phases_to_input_grad(phases, tuple(x.shape), g.shape, w.shape, geom), dx)

    gq = _codes(*y.shape)
    sgc = torch.rand(6) / 50 + 0.01
    wargs = (gq, sgc, x, sx, list(w.shape), list(geom.stride), list(geom.padding), list(geom.dilation), geom.groups)
    torch.library.opcheck(torch.ops.inttrain.conv2d_weight_grad, wargs)
    dw = torch.ops.inttrain.conv2d_weight_grad(*wargs)
    assert torch.equal(dw, conv_kernels.conv2d_weight_grad(gq, sgc, x, sx, tuple(w.shape), geom))


@pytest.mark.parametrize("geom", GEOMS, ids=["stride1", "stride2"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "halves"])
def test_wide_conv_ops_match_eager_kernels_and_opcheck(geom, affine):
    """9-bit codes (int16): DoReFa's affine ones (unsigned activations, odd weights and gradients) and arbitrary
    ones (the int8 halves) behind the same three nodes."""
    torch.manual_seed(1)
    if affine:
        x = _codes(2, 8, 9, 9, dtype=torch.int16, lo=0, hi=256)
        w, make_g = 2 * _codes(6, 8, 3, 3, dtype=torch.int16) + 1, lambda shape: 2 * _codes(*shape, dtype=torch.int16) + 1
    else:
        x, w = _codes(2, 8, 9, 9, dtype=torch.int16, lo=-255, hi=256), _codes(6, 8, 3, 3, dtype=torch.int16, lo=-255, hi=256)
        make_g = lambda shape: _codes(*shape, dtype=torch.int16, lo=-255, hi=256)  # noqa: E731
    x = x.contiguous(memory_format=torch.channels_last)
    sx, sw = torch.tensor([0.02]), torch.rand(6) / 50 + 0.01
    geo = (list(geom.stride), list(geom.padding), list(geom.dilation), geom.groups)
    torch.library.opcheck(torch.ops.inttrain.conv_wide_forward, (x, sx, w, sw, *geo))
    y = torch.ops.inttrain.conv_wide_forward(x, sx, w, sw, *geo)
    assert torch.equal(y, conv_wide.conv2d_forward(x, sx, w, sw, geom))
    g = make_g(tuple(y.shape)).contiguous(memory_format=torch.channels_last)
    sg, swi = torch.tensor([0.03]), torch.tensor([0.05])
    dargs = (g, sg, w, swi, list(x.shape), *geo)
    torch.library.opcheck(torch.ops.inttrain.conv_wide_input_grad, dargs)
    assert torch.equal(torch.ops.inttrain.conv_wide_input_grad(*dargs),
                       conv_wide.conv2d_input_grad(g, sg, w, swi, tuple(x.shape), geom))
    sgc = torch.tensor([0.01])
    wargs = (g, sgc, x, sx, list(w.shape), *geo)
    torch.library.opcheck(torch.ops.inttrain.conv_wide_weight_grad, wargs)
    assert torch.equal(torch.ops.inttrain.conv_wide_weight_grad(*wargs),
                       conv_wide.conv2d_weight_grad(g, sgc, x, sx, tuple(w.shape), geom))
