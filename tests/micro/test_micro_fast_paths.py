"""The fast paths of micro (float32/float64 exact GEMMs on batched im2col, float requantization, int32
update) against the plain int64 reference arithmetic, including shapes that need float64 (K * 127 * 127 > 2**24)."""

import numpy as np
import pytest

from inttrain.micro.gemm import int_matmul_reference, matmul_exact
from inttrain.micro.layers import Conv2d, Linear, Param
from inttrain.micro.ops import IntTensor, requantize, saturate, shift, shift_round
from inttrain.micro.optim import SGD


def _ref_requantize(acc, exp, mode, bits=8):
    acc = np.asarray(acc, dtype=np.int64)
    m = int(np.abs(acc).max()) if acc.size else 0
    s = max(0, m.bit_length() - (bits - 1))
    return saturate(shift_round(acc, s, mode), bits), exp + s


@pytest.mark.parametrize("mode", ["rne", "pstoch", "floor"])
def test_requantize_float_and_int_inputs_match_int64_reference(mode):
    rng = np.random.default_rng(1)
    for trial in range(400):
        mag = int(rng.integers(0, 31))
        a = rng.integers(-(1 << mag), (1 << mag) + 1, size=int(rng.integers(1, 40)))
        if trial % 3 == 0:
            a = ((a >> 3) << 3) | 4                       # exact halves for every shift <= 3
        q, e = _ref_requantize(a, -3, mode)
        for dt in (np.int64, np.int32, np.float64) + ((np.float32,) if mag <= 24 else ()):
            if dt == np.int32 and mag >= 31:
                continue
            r = requantize(a.astype(dt), -3, mode)
            assert r.exp == e and r.q.dtype == np.int8 and np.array_equal(r.q.astype(np.int64), q), (mode, dt)


def test_matmul_exact_picks_an_exact_float():
    rng = np.random.default_rng(2)
    for k in (10, 1040, 1041, 5000):
        a = rng.integers(-127, 128, size=(7, k)).astype(np.int8)
        b = rng.integers(-127, 128, size=(k, 5)).astype(np.int8)
        a[0], b[:, 0] = 127, 127
        c = matmul_exact(a, b)
        assert c.dtype == (np.float32 if k <= 1040 else np.float64)
        assert np.array_equal(c.astype(np.int64), int_matmul_reference(a, b))
    w = rng.integers(-32767, 32768, size=(3, 4000)).astype(np.int16)   # beyond 2**53: int64 chunks
    v = rng.integers(-32767, 32768, size=(4000, 2)).astype(np.int64) << 20
    assert np.array_equal(matmul_exact(w, v), int_matmul_reference(w, v))


def _conv(c, o, k, s, p, rng, mode="pstoch"):
    conv = Conv2d(c, o, k, s, p, bits=8, fwd_round=mode, bwd_round=mode)
    conv.weight = Param(rng.integers(-127, 128, size=(o, c, k, k)), 0, 8)
    conv.params = [conv.weight]
    return conv


@pytest.mark.parametrize("c,o,k,s,p,hw", [
    (3, 4, 3, 1, 1, 36),      # per-sample OH*OW = 1296 > 1040: float64 weight gradient
    (2, 300, 2, 1, 0, 5),     # 300 output channels x 4 overlapping columns: float64 col2im
    (120, 2, 3, 2, 1, 6),     # C*k*k = 1080: float64 forward
    (2, 3, 5, 3, 2, 11),      # stride > 1 with padding
])
def test_conv_fast_path_matches_reference(c, o, k, s, p, hw):
    rng = np.random.default_rng(c + o + k)
    conv = _conv(c, o, k, s, p, rng)
    x = IntTensor(rng.integers(-127, 128, size=(2, c, hw, hw)).astype(np.int8), -4)
    y = conv.forward(x)
    w8 = conv.weight.int8().q
    acc = Conv2d.forward_acc(x.q, w8, s, p)
    q, e = _ref_requantize(acc, x.exp + conv.weight.exp, "pstoch")
    assert y.exp == e and np.array_equal(y.q, q)
    g = IntTensor(rng.integers(-127, 128, size=y.q.shape).astype(np.int8), -7)
    gx = conv.backward(g)
    rgx, rgw = Conv2d.backward_acc(x.q, w8, g.q, s, p)
    assert conv.weight.grad.dtype == np.int32 and np.array_equal(conv.weight.grad, rgw)
    q, e = _ref_requantize(rgx, g.exp + conv.weight.exp, "pstoch")
    assert gx.exp == e and np.array_equal(gx.q, q)


def test_linear_fast_path_matches_reference():
    rng = np.random.default_rng(3)
    lin = Linear(1100, 6, bits=8, fwd_round="rne", bwd_round="rne")
    lin.weight = Param(rng.integers(-127, 128, size=(6, 1100)), -7, 8)
    x = IntTensor(rng.integers(-127, 128, size=(1100, 1100)).astype(np.int8), -7)   # K = 1100 both ways
    y = lin.forward(x)
    q, e = _ref_requantize(Linear.forward_acc(x.q, lin.weight.acc), x.exp - 7, "rne")
    assert y.exp == e and np.array_equal(y.q, q)
    g = IntTensor(rng.integers(-127, 128, size=(1100, 6)).astype(np.int8), -7)
    gx = lin.backward(g)
    rgx, rgw = Linear.backward_acc(x.q, lin.weight.acc, g.q)
    assert np.array_equal(lin.weight.grad, rgw)
    q, e = _ref_requantize(rgx, g.exp - 7, "rne")
    assert gx.exp == e and np.array_equal(gx.q, q)


@pytest.mark.parametrize("rounding", ["rne", "pstoch", "floor"])
@pytest.mark.parametrize("bits", [8, 16])
def test_sgd_int32_fast_path_matches_generic(rounding, bits):
    rng = np.random.default_rng(bits)
    m = (1 << (bits - 1)) - 1
    for lr_shift in (0, 1, 3, 9, 20, 30, 40):
        for scale in (2**10, 2**31 - 1):
            p = Param(rng.integers(-m, m + 1, size=500), -10, bits)
            grad = rng.integers(-scale, scale + 1, size=500)
            grad[:2] = [2**31 - 1, -(2**31 - 1)]
            p.grad, p.grad_exp = grad.astype(np.int32), -12
            want = np.clip(p.acc.astype(np.int64) - shift(grad, p.exp + lr_shift - p.grad_exp, rounding), -m, m)
            SGD([p], lr_shift, rounding=rounding).step()
            assert p.acc.dtype == (np.int16 if bits == 16 else np.int8) and np.array_equal(p.acc, want), lr_shift


def test_sgd_int32_copy_follows_replaced_codes():
    """The optimizer's int32 copy of the codes is only reused while p.acc is the array it wrote (read-only)."""
    rng = np.random.default_rng(5)
    p = Param(rng.integers(-1000, 1000, size=50), -10, 16)
    opt = SGD([p], 4)
    for step in range(3):
        g = rng.integers(-5000, 5000, size=50)
        p.grad, p.grad_exp = g.astype(np.int32), -12
        want = np.clip(p.acc.astype(np.int64) - shift(g, p.exp + 4 - p.grad_exp, "pstoch"), -32767, 32767)
        opt.step()
        assert np.array_equal(p.acc, want)
        with pytest.raises(ValueError):
            p.acc[0] = 1                                   # codes written by the optimizer are read-only
        if step == 1:
            p.acc = np.zeros(50, dtype=np.int16)           # replaced from outside: the copy is rebuilt
    g = rng.integers(-5000, 5000, size=50)
    p.grad, p.grad_exp = g.astype(np.int32), -12
    want = np.clip(p.acc.astype(np.int64) - shift(g, p.exp + 4 - p.grad_exp, "pstoch"), -32767, 32767)
    opt.step()
    assert np.array_equal(p.acc, want)


@pytest.mark.parametrize("hi", [100, 32511, 32639, 32640, 32767])
def test_gemm_view_is_the_rne_int8_view(hi):
    rng = np.random.default_rng(hi)
    for _ in range(50):
        a = rng.integers(-hi, hi + 1, size=40)
        a[0] = rng.choice([hi, -hi])
        q, wf, aw = Param(a, -3, 16).gemm_view()
        ref = saturate(shift_round(a, 8, "rne"), 8)
        assert q.exp == 5 and np.array_equal(q.q, ref) and np.array_equal(wf, ref) and aw == int(np.abs(ref).max())
