"""int_conv2d: forward and both gradients vs float32 convolution, geometry, edge inputs."""

import pytest
from grad_utils import fwd_bwd as _run
import torch
import torch.nn.functional as F

from inttrain.autograd.conv import ConvGeometry, check_conv_precision, int_conv2d
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.numerics import NonFiniteError, sqnr_db
from inttrain.recipes import Int8MixedConfig
from inttrain.spec import GemmPrecision, LayerPrecision, PerChannel, QuantSpec, UnsupportedFormatError

SQNR_MIN_DB = 30.0


def _prec():
    return Int8MixedConfig().precision_for(torch.nn.Conv2d(1, 1, 1), "conv")


CASES = [  # (N, Cin, Cout, H, k, stride, padding, dilation, groups)
    (8, 16, 16, 16, 3, 1, 1, 1, 1),
    (4, 16, 32, 15, 3, 2, 1, 1, 1),
    (3, 8, 8, 9, 1, 1, 0, 1, 1),
    (2, 8, 12, 11, 5, 1, 2, 2, 1),
    (4, 16, 16, 8, 3, 1, 1, 1, 16),  # depthwise
    (2, 8, 8, 10, 3, 2, 0, 1, 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("bias", [True, False])
def test_sqnr_vs_fp32(case, bias):
    n, cin, cout, h, k, s, p, d, g = case
    gen = torch.Generator().manual_seed(sum(case))
    x = torch.randn(n, cin, h, h, generator=gen)
    w = torch.randn(cout, cin // g, k, k, generator=gen) / (cin // g * k * k) ** 0.5
    b = torch.randn(cout, generator=gen) if bias else None
    geom = ConvGeometry((s, s), (p, p), (d, d), g)
    ref = _run(lambda x, w, b: F.conv2d(x, w, b, s, p, d, g), x, w, b,
               torch.randn(F.conv2d(x, w, None, s, p, d, g).shape, generator=gen))
    dy = torch.randn(ref[0].shape, generator=torch.Generator().manual_seed(sum(case)))
    ref = _run(lambda x, w, b: F.conv2d(x, w, b, s, p, d, g), x, w, b, dy)
    reset_kernel_calls()
    got = _run(lambda x, w, b: int_conv2d(x, w, b, geom, _prec()), x, w, b, dy)
    for name, r, q in zip(("y", "dx", "dW"), ref, got):
        db = sqnr_db(r, q)
        assert db >= SQNR_MIN_DB, f"{name}: SQNR {db:.1f} dB < {SQNR_MIN_DB} dB"
    calls = int_kernel_calls()
    assert min(calls.get(k, 0) for k in ("conv_fwd", "conv_dgrad", "conv_wgrad")) >= 1, calls
    if bias:
        assert torch.allclose(got[3], ref[3], rtol=1e-4, atol=1e-4)


def test_empty_batch():
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    x = torch.zeros(0, 3, 8, 8, requires_grad=True)
    y = int_conv2d(x, w, None, ConvGeometry((1, 1), (1, 1), (1, 1), 1), _prec())
    assert y.shape == (0, 4, 8, 8)
    y.sum().backward()
    assert x.grad.shape == x.shape and torch.equal(w.grad, torch.zeros_like(w))


def test_zero_input_gives_bias():
    b = torch.randn(4)
    y = int_conv2d(torch.zeros(2, 3, 5, 5), torch.randn(4, 3, 3, 3), b, ConvGeometry((1, 1), (1, 1), (1, 1), 1), _prec())
    assert torch.equal(y, b.reshape(1, 4, 1, 1).expand(2, 4, 5, 5))


def test_nan_input_raises():
    x = torch.randn(1, 3, 5, 5)
    x[0, 1, 2, 2] = float("inf")
    with pytest.raises(NonFiniteError, match="conv2d input"):
        int_conv2d(x, torch.randn(4, 3, 3, 3), None, ConvGeometry((1, 1), (1, 1), (1, 1), 1), _prec())


def test_wrong_channels():
    with pytest.raises(ValueError, match="expects 3"):
        int_conv2d(torch.randn(1, 4, 5, 5), torch.randn(4, 3, 3, 3), None, ConvGeometry((1, 1), (0, 0), (1, 1), 1), _prec())


def test_per_channel_activation_rejected_for_conv():
    bad = LayerPrecision(forward=GemmPrecision(QuantSpec(granularity=PerChannel(0)), QuantSpec(granularity=PerChannel(0))))
    with pytest.raises(UnsupportedFormatError, match="PerTensor"):
        check_conv_precision(bad)


def test_channels_last_and_contiguous_inputs_agree():
    x = torch.randn(2, 8, 9, 9)
    w = torch.randn(8, 8, 3, 3)
    geom = ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    a = int_conv2d(x, w, None, geom, _prec())
    b = int_conv2d(x.contiguous(memory_format=torch.channels_last), w, None, geom, _prec())
    assert torch.equal(a, b)


def test_nan_output_gradient_propagates():
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    y = int_conv2d(x, w, None, ConvGeometry((1, 1), (1, 1), (1, 1), 1), _prec())
    dy = torch.randn_like(y)
    dy[0, 0, 0, 0] = float("nan")
    y.backward(dy)
    assert torch.isnan(x.grad).all() and torch.isnan(w.grad).all()
