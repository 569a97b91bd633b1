"""The weight-gradient kernel that quantizes a float gradient while packing it: the codes of quantize_matrix bit for
bit (nearest and stochastic rounding), the same dW on the torch fallback, as a graph node, and in a conv layer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import inttrain
from inttrain.autograd import conv as conv_fn
from inttrain.kernels import conv as K
from inttrain.kernels import native
from inttrain.kernels.conv_geometry import ConvGeometry
from inttrain.kernels.fused import matrix_scale, quantize_matrix
from inttrain.recipes import Int8MixedConfig
from inttrain.spec import PerChannel, PerTensor, QuantSpec, Rounding
from inttrain.spec.formats import IntFormat

needs_native = pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.LIBRARY.reason}")
RNE, SR = Rounding.NEAREST_EVEN, Rounding.STOCHASTIC

# (n, ci, co, hw, k, stride, pad): whole and partial 16-channel tiles and 4-pixel groups, strides 1-2, 1x1 kernels
GEOMETRIES = [(3, 5, 7, 9, 3, 1, 1), (4, 16, 32, 10, 3, 2, 1), (2, 8, 20, 7, 1, 2, 0), (3, 16, 16, 12, 3, 1, 1),
              (2, 32, 48, 6, 3, 1, 1)]


def _operands(geometry: tuple, channels_last: bool, seed: int):
    n, ci, co, hw, k, s, p = geometry
    gen = torch.Generator().manual_seed(seed)
    xq = torch.randint(-128, 128, (n, ci, hw, hw), dtype=torch.int8, generator=gen)
    ho = (hw + 2 * p - k) // s + 1
    dy = torch.randn((n, co, ho, ho), generator=gen) * torch.rand((1, co, 1, 1), generator=gen)
    if channels_last:
        xq, dy = xq.contiguous(memory_format=torch.channels_last), dy.contiguous(memory_format=torch.channels_last)
    return K.to_shifted_u8(xq), dy, ConvGeometry((s, s), (p, p), (1, 1), 1), (co, ci, k, k)


def _spec(bits: int, rounding: Rounding, per_channel: bool) -> QuantSpec:
    return QuantSpec(IntFormat(bits), PerChannel() if per_channel else PerTensor(), rounding)


def _rows(dy: torch.Tensor) -> torch.Tensor:
    return dy.permute(0, 2, 3, 1).reshape(-1, dy.shape[1])


@needs_native
@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("rounding", [RNE, SR])
@pytest.mark.parametrize("per_channel", [False, True])
def test_equals_quantize_matrix_then_the_code_kernel(geometry: tuple, channels_last: bool, rounding: Rounding,
                                                     per_channel: bool) -> None:
    xu8, dy, geom, wshape = _operands(geometry, channels_last, hash(geometry) % 2**31)
    spec, seed = _spec(8, rounding, per_channel), 0xDEADBEEF
    codes, scale = quantize_matrix(_rows(dy).contiguous(), spec, 1, seed=seed)
    gq = codes.reshape(dy.shape[0], dy.shape[2], dy.shape[3], -1).permute(0, 3, 1, 2)
    want = native.conv2d_weight_grad_int(gq, xu8, wshape, geom.stride, geom.padding, geom.dilation)
    got = native.conv2d_weight_grad_float(dy, scale, 127, rounding is SR, seed, xu8, wshape, geom.stride,
                                          geom.padding, geom.dilation)
    assert torch.equal(got, want)


@needs_native
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rounding", [RNE, SR])
def test_torch_fallback_gives_the_same_weight_gradient(bits: int, rounding: Rounding,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    xu8, dy, geom, wshape = _operands(GEOMETRIES[1], True, 3)
    scale = matrix_scale(_rows(dy), _spec(bits, rounding, True), 1).reshape(-1)
    sx = torch.tensor([0.02])
    qmax = 2 ** (bits - 1) - 1
    fast = K.conv2d_weight_grad_float(dy, scale, qmax, rounding is SR, 77, xu8, sx, wshape, geom)
    monkeypatch.setattr(native, "available", lambda: False)
    slow = K.conv2d_weight_grad_float(dy, scale, qmax, rounding is SR, 77, xu8, sx, wshape, geom)
    assert fast.dtype == torch.float32 and torch.equal(fast, slow)


@needs_native
def test_stochastic_codes_depend_on_the_seed_and_average_to_the_value() -> None:
    xu8, dy, geom, wshape = _operands(GEOMETRIES[3], True, 5)
    scale = matrix_scale(_rows(dy), _spec(8, SR, True), 1).reshape(-1)
    a, b = (native.conv2d_weight_grad_float(dy, scale, 127, True, s, xu8, wshape, geom.stride, geom.padding,
                                            geom.dilation) for s in (1, 2))
    assert not torch.equal(a, b)
    exact = torch.nn.grad.conv2d_weight((xu8.double() - 128), wshape, (dy / scale.view(1, -1, 1, 1)).double(),
                                        stride=geom.stride, padding=geom.padding).long()
    rne = native.conv2d_weight_grad_float(dy, scale, 127, False, 0, xu8, wshape, geom.stride, geom.padding, geom.dilation)
    # unbiased: the mean of many seeds is closer to the exact sums than rounding to nearest is on average
    mean = torch.stack([native.conv2d_weight_grad_float(dy, scale, 127, True, s, xu8, wshape, geom.stride,
                                                        geom.padding, geom.dilation).double() for s in range(16)]).mean(0)
    assert (mean - exact).abs().mean() < (rne.double() - exact).abs().mean()


@needs_native
@pytest.mark.parametrize("geometry", [GEOMETRIES[0], GEOMETRIES[3], GEOMETRIES[4]])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("rounding", [RNE, SR])
def test_bfloat16_gradient_reads_as_its_float32_upcast(geometry: tuple, channels_last: bool,
                                                       rounding: Rounding) -> None:
    xu8, dy, geom, wshape = _operands(geometry, channels_last, 7)
    dyb = dy.to(torch.bfloat16)
    scale = matrix_scale(_rows(dyb.float()), _spec(8, rounding, True), 1).reshape(-1)
    args = (scale, 127, rounding is SR, 99, xu8, wshape, geom.stride, geom.padding, geom.dilation)
    got = native.conv2d_weight_grad_float(dyb, *args)
    assert torch.equal(got, native.conv2d_weight_grad_float(dyb.float(), *args))


@needs_native
def test_refuses_wrong_inputs() -> None:
    xu8, dy, geom, wshape = _operands(GEOMETRIES[0], True, 0)
    args = (xu8, wshape, geom.stride, geom.padding, geom.dilation)
    with pytest.raises(TypeError, match="expected a CPU float32/bfloat16 gradient"):
        native.conv2d_weight_grad_float(dy.double(), torch.ones(1), 127, False, 0, *args)
    with pytest.raises(ValueError, match=r"qmax must be in \[1, 127\]"):
        native.conv2d_weight_grad_float(dy, torch.ones(1), 200, False, 0, *args)
    with pytest.raises(ValueError, match="g_scale has 3 values, expected 1 or 7"):
        native.conv2d_weight_grad_float(dy, torch.ones(3), 127, False, 0, *args)


def test_graph_node_passes_opcheck() -> None:
    xu8, dy, geom, wshape = _operands(GEOMETRIES[0], True, 1)
    scale = matrix_scale(_rows(dy), _spec(8, SR, True), 1).reshape(-1)
    args = (dy, scale, torch.tensor(9, dtype=torch.int64), xu8, torch.tensor([0.05]), list(wshape),
            list(geom.stride), list(geom.padding), list(geom.dilation), 1, 127, True)
    torch.library.opcheck(torch.ops.inttrain.conv2d_weight_grad_float.default, args)


def _conv_grads(compiled: bool, rounding: Rounding) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    layer = inttrain.prepare_(torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1)),
                              Int8MixedConfig(grad_rounding=rounding))[0]
    x = torch.randn(4, 8, 10, 10, generator=torch.Generator().manual_seed(1), requires_grad=True)
    dy = torch.randn(4, 16, 10, 10, generator=torch.Generator().manual_seed(2))
    (torch.compile(layer, fullgraph=True) if compiled else layer)(x).backward(dy)
    return x.grad, layer.weight.grad


@needs_native
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("rounding", [RNE, SR])
def test_conv_layer_gradients_unchanged_by_quantizing_in_the_kernel(compiled: bool, rounding: Rounding,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """dW of an int8 conv layer is the same bit for bit whether the graph or the kernel makes dy's codes."""
    dx_kernel, dw_kernel = _conv_grads(compiled, rounding)
    monkeypatch.setattr(conv_fn, "_codes_in_kernel", lambda *a: False)
    torch._dynamo.reset()  # retrace: the choice is made while tracing
    dx_graph, dw_graph = _conv_grads(compiled, rounding)
    assert torch.equal(dx_kernel, dx_graph) and torch.equal(dw_kernel, dw_graph)


def test_specs_the_kernel_declines() -> None:
    dy = torch.randn(2, 3, 4, 4)
    assert conv_fn._codes_in_kernel(_spec(8, RNE, True), dy)
    assert not conv_fn._codes_in_kernel(_spec(8, Rounding.FLOOR, True), dy)
    assert not conv_fn._codes_in_kernel(_spec(12, RNE, True), dy)
    assert not conv_fn._codes_in_kernel(dataclasses.replace(_spec(8, RNE, True), fmt=IntFormat(8, signed=False)), dy)
    assert not conv_fn._codes_in_kernel(_spec(8, RNE, True), dy[:0])
