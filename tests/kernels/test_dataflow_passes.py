"""The dataflow passes: batch norm of float rows (codes, statistics, the ReLU amax from per-channel extremes)
and the ReLU quantize with a known amax, compiled against eager and against their definitions."""

import pytest
import torch

from inttrain.autograd.qactivation import quantize_rows_of
from inttrain.kernels import dataflow_passes as passes
from inttrain.spec import IntFormat, PerChannel, QuantSpec


@pytest.fixture(params=["0", "1"], ids=["eager", "compiled"])
def mode(request, monkeypatch):
    monkeypatch.setenv("INTTRAIN_COMPILE", request.param)
    return request.param


def _rows(rows=300, channels=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, channels, generator=g) * torch.linspace(0.1, 5, channels) + torch.linspace(-2, 3, channels)
    w = torch.linspace(-1.5, 2.0, channels)  # negative weights flip which extreme of x gives max(y)
    b = torch.linspace(-0.3, 0.4, channels)
    return x, w, b


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_batch_norm_of_float_rows_matches_torch_and_quantizes_its_input(mode, sign):
    x, w, b = _rows()
    w = sign * w
    codes, scale, y, mean, var, invstd, relu_amax = passes.batch_norm_forward_float_rows(x, w, b, 1e-5)
    ref = torch.nn.functional.batch_norm(x, None, None, w, b, training=True, eps=1e-5)
    assert torch.allclose(y, ref, atol=1e-5, rtol=1e-5)
    assert torch.allclose(mean, x.mean(0), atol=1e-6) and torch.allclose(var, x.var(0, unbiased=False), rtol=1e-5)
    assert torch.allclose(invstd, torch.rsqrt(var + 1e-5))
    # the codes are the per-channel absmax quantization of x (uint8 = code + 128), bit for bit
    q, s = quantize_rows_of(x, QuantSpec(IntFormat(8), PerChannel(1)), zero_point=128)
    assert torch.equal(codes, q) and torch.equal(scale, s.reshape(-1))
    # the ReLU amax from each channel's extremes equals an amax pass over the output, up to float rounding
    assert torch.allclose(relu_amax, y.clamp_min(0).amax().reshape(1), rtol=1e-6, atol=0)


def test_relu_amax_is_zero_when_every_output_is_negative(mode):
    x, w, _ = _rows(channels=4)
    _, _, y, *_, relu_amax = passes.batch_norm_forward_float_rows(x, w.abs(), torch.full((4,), -100.0), 1e-5)
    assert (y < 0).all() and relu_amax.item() == 0.0
    codes, scale = passes.relu_quantize_rows(y, 8, relu_amax)
    assert scale.item() == 1.0 and (codes == 128).all()  # amax 0 -> scale 1, every code zero


def test_non_finite_input_propagates_to_the_relu_amax(mode):
    x, w, b = _rows()
    x[7, 3] = float("nan")
    assert passes.batch_norm_forward_float_rows(x, w, b, 1e-5)[-1].isnan().all()
    x[7, 3] = float("inf")
    assert not passes.batch_norm_forward_float_rows(x, w, b, 1e-5)[-1].isfinite().all()


@pytest.mark.parametrize("bits", [8, 4])
def test_relu_quantize_with_a_known_amax_equals_the_amax_pass(mode, bits):
    x, _, _ = _rows()
    codes, scale = passes.relu_quantize_rows(x, bits)
    known, known_scale = passes.relu_quantize_rows(x, bits, x.clamp_min(0).amax().reshape(1))
    assert torch.equal(codes, known) and torch.equal(scale, known_scale)
    qmax = (1 << (bits - 1)) - 1
    assert int(codes.max()) == 128 + qmax and int(codes.min()) == 128
