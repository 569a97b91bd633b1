"""The torch integer helpers, loss table and layer pieces against inttrain.micro, value for value."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inttrain import integer_only as T
from inttrain import micro as M
from inttrain.integer_only import loss as TL
from inttrain.integer_only import ops as TO
from inttrain.integer_only.layers import col2im, im2col
from inttrain.kernels.counters import int_kernel_calls, reset_kernel_calls
from inttrain.micro import layers as ML
from inttrain.micro import loss as MLo
from inttrain.micro import ops as MO

I64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(xs=st.lists(I64, min_size=1, max_size=40), s=st.integers(0, 70), mode=st.sampled_from(MO.ROUNDING_MODES))
def test_shift_round_matches_micro_on_all_int64(xs, s, mode):
    a = np.array(xs, dtype=np.int64)
    assert np.array_equal(TO.shift_round(torch.from_numpy(a), s, mode).numpy(), MO.shift_round(a, s, mode))


@settings(max_examples=200, deadline=None)
@given(xs=st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=40), k=st.integers(0, 70),
       limit=st.sampled_from([MO.INT32_MAX, 63 * 256, 127]))
def test_left_shift_saturates_like_micro(xs, k, limit):
    a = np.array(xs, dtype=np.int64)
    assert np.array_equal(TO.shift_left_saturate(torch.from_numpy(a), k, limit).numpy(),
                          MO.shift_left_saturate(a, k, limit))


@settings(max_examples=150, deadline=None)
@given(xs=st.lists(st.integers(-(2**31) + 1, 2**31 - 1), min_size=0, max_size=40),
       e=st.integers(-64, 64), mode=st.sampled_from(MO.ROUNDING_MODES), bits=st.sampled_from([8, 16]))
def test_requantize_matches_micro(xs, e, mode, bits):
    a = np.array(xs, dtype=np.int64)
    t = TO.requantize(torch.from_numpy(a.astype(np.int32)), e, mode, bits)
    m = MO.requantize(a, e, mode, bits)
    assert t.exp == m.exp and t.q.dtype == (torch.int8 if bits == 8 else torch.int16)
    assert np.array_equal(t.q.numpy(), m.q)


def test_exp2_table_is_shipped_and_equal_to_micro():
    assert TL.EXP2_LUT.dtype == torch.int64 and TL.EXP2_LUT.shape == (256,)
    assert np.array_equal(TL.EXP2_LUT.numpy(), MLo.EXP2_LUT)
    assert int(TL.EXP2_LUT.sum()) == TL.EXP2_LUT_SUM == 12085828
    assert (int(TL.EXP2_LUT[0]), int(TL.EXP2_LUT[128]), int(TL.EXP2_LUT[255])) == (32768, 46341, 65359)
    assert TL.LOG2E_Q8 == MLo.LOG2E_Q8 == 369


def test_exp2_q15_every_input():
    t = np.arange(-(64 << 8), 1, dtype=np.int64)
    assert np.array_equal(TL.exp2_q15(torch.from_numpy(t)).numpy(), MLo.exp2_q15(t))


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), e=st.integers(-12, 6), n=st.integers(1, 8), c=st.integers(1, 12))
def test_softmax_ce_gradient_matches_micro(seed, e, n, c):
    rng = np.random.default_rng(seed)
    q = rng.integers(-127, 128, size=(n, c)).astype(np.int8)
    y = rng.integers(0, c, size=n)
    merr, mp = M.softmax_cross_entropy_grad(M.IntTensor(q, e), y)
    terr, tp = T.softmax_cross_entropy_grad(T.IntTensor(torch.from_numpy(q), e), torch.from_numpy(y))
    assert np.array_equal(tp.numpy(), mp) and np.array_equal(terr.q.numpy(), merr.q) and terr.exp == merr.exp


@pytest.mark.parametrize("k,s,p", [(1, 1, 0), (3, 1, 1), (3, 2, 0), (3, 2, 2), (5, 3, 1), (2, 2, 0)])
def test_im2col_col2im_match_micro(k, s, p):
    rng = np.random.default_rng(k * 100 + s * 10 + p)
    x = rng.integers(-127, 128, size=(2, 3, 9, 7)).astype(np.int8)
    mc, moh, mow = ML.im2col(x, k, k, s, p)
    tc, toh, tow = im2col(torch.from_numpy(x), k, s, p)
    assert (moh, mow) == (toh, tow) and np.array_equal(tc.numpy(), mc)
    g = rng.integers(-(2**20), 2**20, size=mc.shape)
    ref = ML.col2im(g, x.shape, k, k, s, p, moh, mow)
    assert np.array_equal(col2im(torch.from_numpy(g), x.shape, k, s, p, toh, tow).numpy(), ref)
    # int32 sums when the stated bound allows them (2**20 x at most 9 overlaps), int64 past it: same values
    for bound in (2**20, 2**29):
        out = col2im(torch.from_numpy(g).to(torch.int32), x.shape, k, s, p, toh, tow, bound)
        assert out.dtype == torch.int64 and np.array_equal(out.numpy(), ref)
    wide = rng.integers(2**30, 2**31 - 1, size=mc.shape)   # int32 columns whose sums overflow int32
    assert np.array_equal(col2im(torch.from_numpy(wide).to(torch.int32), x.shape, k, s, p, toh, tow, 2**31 - 1).numpy(),
                          ML.col2im(wide, x.shape, k, k, s, p, moh, mow))


def test_maxpool_first_maximum_wins_like_micro():
    x = np.zeros((1, 1, 5, 5), dtype=np.int8)          # all ties: the first (top-left) element wins
    x[0, 0, 1, 1] = x[0, 0, 0, 3] = x[0, 0, 1, 2] = 7  # a tie inside the second window
    g = np.arange(1, 5, dtype=np.int8).reshape(1, 1, 2, 2)
    mp, tp = ML.MaxPool2d(2), T.MaxPool2d(2)
    my, ty = mp.forward(M.IntTensor(x, 0)), tp.forward(T.IntTensor(torch.from_numpy(x), 0))
    assert np.array_equal(ty.q.numpy(), my.q)
    mg, tg = mp.backward(M.IntTensor(g, -3)), tp.backward(T.IntTensor(torch.from_numpy(g), -3))
    assert np.array_equal(tg.q.numpy(), mg.q) and tg.exp == -3 and tg.q.shape == (1, 1, 5, 5)


@pytest.mark.parametrize("shift_", [0, 3, 20, 40])
@pytest.mark.parametrize("momentum", [None, 1, 16])
def test_sgd_matches_micro_including_left_shifts(shift_, momentum):
    rng = np.random.default_rng(shift_)
    codes = rng.integers(-32767, 32768, size=(6, 5))
    mp = ML.Param(codes, -14, 16)
    tp = T.Param.from_micro(mp)
    mo, to = M.SGD([mp], shift_, momentum), T.SGD([tp], shift_, momentum)
    for i in range(4):
        g = rng.integers(-(2**31) + 1, 2**31, size=(6, 5))
        mp.grad, mp.grad_exp = g, -30 + 9 * i         # s = -14 + shift - grad_exp: right and left shifts
        tp.grad, tp.grad_exp = torch.from_numpy(g.astype(np.int32)), -30 + 9 * i
        mo.step()
        to.step()
        assert np.array_equal(tp.acc.numpy(), mp.acc) and tp.acc.dtype == torch.int16
        if momentum:
            assert np.array_equal(tp.mom.numpy(), mp.mom)


def test_gemms_run_on_the_integer_kernel():
    model = T.Sequential.from_description({"input_shape": [16], "layers": [
        {"type": "linear", "in_features": 16, "out_features": 8}, {"type": "relu"},
        {"type": "linear", "in_features": 8, "out_features": 4}]})
    x = torch.randint(-127, 128, (5, 16), dtype=torch.int8)
    reset_kernel_calls()
    T.train_step(model, T.SGD(model.params(), 4), T.IntTensor(x, -7), torch.tensor([0, 1, 2, 3, 0]))
    assert int_kernel_calls().get("int8_mm", 0) == 5  # 2 forward, 2 weight grads, 1 input error
