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


def _prec():  # one scale per tensor everywhere (the per-sample default has tests of its own below)
    return Int8MixedConfig(per_sample_grad=False).precision_for(torch.nn.Conv2d(1, 1, 1), "conv")


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


@pytest.mark.parametrize("per_sample", [False, True], ids=["per-tensor", "per-sample"])
def test_nan_output_gradient_propagates(per_sample):
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    y = int_conv2d(x, w, None, ConvGeometry((1, 1), (1, 1), (1, 1), 1), _per_sample_prec() if per_sample else _prec())
    dy = torch.randn_like(y)
    dy[int(per_sample), 0, 0, 0] = float("nan")  # per sample: a NaN in the second sample's scale still reaches every grad
    y.backward(dy)
    assert torch.isnan(x.grad).all() and torch.isnan(w.grad).all()


def _per_sample_prec(**kw):
    return Int8MixedConfig(per_sample_grad=True, **kw).precision_for(torch.nn.Conv2d(1, 1, 1), "conv")


def test_per_sample_grad_layout_is_accepted_only_where_it_factors_out():
    prec = _per_sample_prec()
    assert prec.grad_input.lhs.granularity == PerChannel(0)
    check_conv_precision(prec)  # the dx GEMM never sums across samples
    check_conv_precision(_per_sample_prec(bits=12))  # the two-half (9..16-bit) GEMM too, at scale 1
    bad = LayerPrecision(forward=GemmPrecision(QuantSpec(granularity=PerChannel(0)), QuantSpec(granularity=PerChannel(0))))
    with pytest.raises(UnsupportedFormatError, match="PerTensor"):  # the forward sums over channels and window
        check_conv_precision(bad)


@pytest.mark.parametrize("stride,bits", [(1, 8), (2, 8), (1, 12), (2, 12)])
def test_per_sample_grad_input_is_the_exact_sum_of_each_samples_codes(stride, bits):
    """dx = conv_transpose(q_n * s_n, q_w * s_w) with q_n the nearest codes of sample n's gradient on its own
    scale s_n = amax_n / qmax: the kernel's integer sum times the two scales, checked against float64 (8 bits:
    the int8 kernel; 12: the two-half GEMM)."""
    gen = torch.Generator().manual_seed(stride)
    x = torch.randn(4, 8, 9, 9, generator=gen, requires_grad=True)
    w = torch.randn(6, 8, 3, 3, generator=gen) / 9
    geom = ConvGeometry((stride, stride), (1, 1), (1, 1), 1)
    y = int_conv2d(x, w, None, geom, _per_sample_prec(bits=bits))
    dy = torch.randn(y.shape, generator=gen) * torch.logspace(0, -4, 4).view(-1, 1, 1, 1)
    y.backward(dy)
    qmax = 2 ** (bits - 1) - 1
    s = dy.abs().amax((1, 2, 3), keepdim=True).double() / qmax
    qg = torch.round(dy.double() / s).clamp(-qmax, qmax)
    sw = w.abs().amax((0, 2, 3), keepdim=True).double() / qmax  # per input channel in the dx GEMM
    qw = torch.round(w.double() / sw).clamp(-qmax, qmax)
    # the integer sum first (exact in float64), then the scales: a sum that is 0 in integers must come out 0
    ref = torch.nn.grad.conv2d_input(x.shape, qw, qg, (stride, stride), (1, 1)) * sw.view(1, -1, 1, 1) * s
    torch.testing.assert_close(x.grad.double(), ref, rtol=1e-5, atol=0)


def test_per_sample_grad_keeps_the_small_samples_gradients():
    """Gradients 10**4 apart across the batch: one scale per tensor rounds the smallest samples' codes to zero, one
    scale per sample keeps every sample's input gradient at int8 quality."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4, 8, 8, 8, generator=gen)
    w = torch.randn(8, 8, 3, 3, generator=gen) / 24
    geom = ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    dy = torch.randn(4, 8, 8, 8, generator=gen) * torch.logspace(0, -4, 4).view(-1, 1, 1, 1)
    ref = _run(lambda x, w, b: F.conv2d(x, w, None, 1, 1), x, w, None, dy)[1]
    per_tensor = _run(lambda x, w, b: int_conv2d(x, w, None, geom, _prec()), x, w, None, dy)[1]
    per_sample = _run(lambda x, w, b: int_conv2d(x, w, None, geom, _per_sample_prec()), x, w, None, dy)[1]
    assert torch.count_nonzero(per_tensor[3]) == 0  # 1e-4 of the largest: every code rounds to zero
    assert min(sqnr_db(ref[n], per_sample[n]) for n in range(4)) >= SQNR_MIN_DB

