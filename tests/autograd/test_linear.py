"""int_linear: forward and both gradients vs float32, edge inputs, per-GEMM precision switches."""

import pytest
from grad_utils import fwd_bwd as _run
import torch
import torch.nn.functional as F

from inttrain.autograd import int_linear
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.numerics import NonFiniteError, sqnr_db
from inttrain.spec import GemmPrecision, IntFormat, LayerPrecision, PerChannel, QuantSpec, Rounding

SQNR_MIN_DB = 30.0  # issue bar at 8 bits, round to nearest


def _pair(shape_x=(64, 96), out=48, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape_x, generator=g)
    w = torch.randn(out, shape_x[-1], generator=g) / shape_x[-1] ** 0.5
    b = torch.randn(out, generator=g) if bias else None
    dy = torch.randn(*shape_x[:-1], out, generator=g)
    return x, w, b, dy


@pytest.mark.parametrize("shape_x", [(64, 96), (2, 5, 33), (1, 7)])
def test_sqnr_vs_fp32_at_8_bits(shape_x):
    x, w, b, dy = _pair(shape_x)
    reset_kernel_calls()
    got = _run(lambda x, w, b: int_linear(x, w, b, LayerPrecision()), x, w, b, dy)
    assert int_kernel_calls()["int8_mm"] == 3, "forward, grad_input and grad_weight must each run an int8 GEMM"
    ref = _run(F.linear, x, w, b, dy)
    for name, r, q in zip(("y", "dx", "dW"), ref, got):
        db = sqnr_db(r, q)
        assert db >= SQNR_MIN_DB, f"{name}: SQNR {db:.1f} dB < {SQNR_MIN_DB} dB"
    assert torch.allclose(got[3], ref[3], rtol=1e-5, atol=1e-5), "bias gradient is exact float"


def test_higher_bits_give_higher_sqnr():
    x, w, b, dy = _pair()
    ref = _run(F.linear, x, w, b, dy)

    def prec(bits):
        s = QuantSpec(IntFormat(bits), PerChannel(0))
        g = GemmPrecision(s, s)
        return LayerPrecision(g, g, g)

    sq = {bits: sqnr_db(ref[2], _run(lambda x, w, b: int_linear(x, w, b, prec(bits)), x, w, b, dy)[2])
          for bits in (4, 8, 12)}
    assert sq[4] + 15 < sq[8] < sq[12] - 15, sq  # ~6 dB per bit


def test_float_weight_grad_switch_runs_two_int_gemms():
    x, w, b, dy = _pair()
    p = LayerPrecision()
    p = LayerPrecision(p.forward, p.grad_input, GemmPrecision(p.grad_weight.lhs, p.grad_weight.rhs, integer=False))
    reset_kernel_calls()
    got = _run(lambda x, w, b: int_linear(x, w, b, p), x, w, b, dy)
    assert int_kernel_calls()["int8_mm"] == 2
    ref = _run(F.linear, x, w, b, dy)
    assert torch.allclose(got[2], ref[2], rtol=1e-4, atol=1e-4), "float dW from the saved float input is exact"


def test_stochastic_gradients_are_seeded():
    x, w, b, dy = _pair()
    s = QuantSpec(granularity=PerChannel(0), rounding=Rounding.STOCHASTIC)
    p = LayerPrecision(grad_input=GemmPrecision(s, QuantSpec(granularity=PerChannel(0))))
    a = _run(lambda x, w, b: int_linear(x, w, b, p, (1, 2, 3)), x, w, b, dy)[1]
    a2 = _run(lambda x, w, b: int_linear(x, w, b, p, (1, 2, 3)), x, w, b, dy)[1]
    c = _run(lambda x, w, b: int_linear(x, w, b, p, (1, 5, 3)), x, w, b, dy)[1]
    assert torch.equal(a, a2) and not torch.equal(a, c)


def test_empty_batch():
    x, w, b, _ = _pair()
    x = torch.zeros(0, 96, requires_grad=True)
    y = int_linear(x, w.requires_grad_(), b, LayerPrecision())
    assert y.shape == (0, 48)
    y.sum().backward()
    assert x.grad.shape == (0, 96) and torch.equal(w.grad, torch.zeros_like(w))


def test_all_zero_input_gives_zero_output_plus_bias():
    _, w, b, _ = _pair()
    y = int_linear(torch.zeros(4, 96), w, b, LayerPrecision())
    assert torch.equal(y, b.expand(4, -1))


def test_nan_input_raises_clearly():
    x, w, b, _ = _pair()
    x[3, 3] = float("nan")
    with pytest.raises(NonFiniteError, match="linear input"):
        int_linear(x, w, b, LayerPrecision())


def test_nan_output_gradient_propagates_to_all_grads():
    x, w, b, dy = _pair()
    dy[0, 0] = float("inf")
    _, dx, dw, db = _run(lambda x, w, b: int_linear(x, w, b, LayerPrecision()), x, w, b, dy)
    assert torch.isnan(dx).all() and torch.isnan(dw).all() and torch.isnan(db).all()


def test_wrong_feature_count():
    _, w, b, _ = _pair()
    with pytest.raises(ValueError, match="96"):
        int_linear(torch.randn(4, 95), w, b, LayerPrecision())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_dtypes_return_input_dtype(dtype):
    x, w, b, dy = _pair()
    xd, wd = x.to(dtype).requires_grad_(), w.to(dtype).requires_grad_()
    y = int_linear(xd, wd, b.to(dtype), LayerPrecision())
    y.backward(dy.to(dtype))
    assert y.dtype == xd.grad.dtype == wd.grad.dtype == dtype
    assert sqnr_db(F.linear(x, w, b), y.float()) > 25


def test_int16_linear_runs_on_int8_kernels():
    x, w, b, dy = _pair()
    s = QuantSpec(IntFormat(16), PerChannel(0))
    g = GemmPrecision(s, s)
    reset_kernel_calls()
    got = _run(lambda x, w, b: int_linear(x, w, b, LayerPrecision(g, g, g)), x, w, b, dy)
    assert int_kernel_calls()["int8_mm"] == 3  # each int16 x int16 GEMM is one stacked int8 GEMM
    ref = _run(F.linear, x, w, b, dy)
    assert sqnr_db(ref[2], got[2]) > 80


@pytest.mark.parametrize("k,n", [(1, 4), (4, 1), (1, 1)])
def test_one_feature_layers(k, n):
    x, w, b, dy = _pair((8, k), n)
    got = _run(lambda x, w, b: int_linear(x, w, b, LayerPrecision()), x, w, b, dy)
    ref = _run(F.linear, x, w, b, dy)
    for name, r, q in zip(("y", "dx", "dW"), ref, got):
        assert sqnr_db(r, q) >= SQNR_MIN_DB, f"{name}: {sqnr_db(r, q):.1f} dB"
