import numpy as np
import pytest

from inttrain.micro.layers import Param
from inttrain.micro.loss import EXP2_LUT, EXP2_LUT_SUM, LOG2E_Q8, exp2_q15, softmax_cross_entropy_grad, softmax_q7
from inttrain.micro.ops import IntTensor
from inttrain.micro.optim import SGD


def test_table_constants():
    assert EXP2_LUT.shape == (256,) and int(EXP2_LUT.sum()) == EXP2_LUT_SUM
    assert EXP2_LUT[0] == 32768 and EXP2_LUT[128] == 46341 and EXP2_LUT[255] == 65359
    assert LOG2E_Q8 == round(256 / np.log(2))


def test_exp2_hand_cases():
    # t = 0 -> 2^15; t = -256 (-1.0) -> 2^14; t = -128 (-0.5) -> LUT[128] >> 1 = 23170.5 -> 23170 (half even)
    assert exp2_q15(np.array([0, -256, -128, -(40 << 8)])).tolist() == [32768, 16384, 23170, 0]


def test_softmax_close_to_float():
    rng = np.random.default_rng(0)
    for e in (-6, -3, 0, 2):
        q = rng.integers(-127, 128, size=(50, 10)).astype(np.int8)
        p = softmax_q7(IntTensor(q, e))
        z = q * 2.0**e
        pf = np.exp(z - z.max(1, keepdims=True))
        pf /= pf.sum(1, keepdims=True)
        assert np.abs(p / 128 - pf).max() <= 2.5 / 128
        assert np.all(np.abs(p.sum(1) - 128) <= 5)


def test_error_hand_built():
    # two equal logits and one far below: p = [64, 64, 0]
    err, p = softmax_cross_entropy_grad(IntTensor(np.array([[100, 100, -100]], dtype=np.int8), -2), np.array([0]))
    assert p.tolist() == [[64, 64, 0]]
    assert err.exp == -7 and err.q.tolist() == [[-64, 64, 0]]
    # p_y = 0 -> -128 saturates to -127
    err, _ = softmax_cross_entropy_grad(IntTensor(np.array([[127, -127]], dtype=np.int8), 0), np.array([1]))
    assert err.q.tolist() == [[127, -127]]


def test_16bit_error_is_the_q15_softmax_minus_the_label():
    """bits 16: p in Q15 (round(E * 2**15 / S)), error p - onehot as int16 at exponent -15; the Q7 error is the
    same softmax rounded 8 bits coarser, and probabilities in (2**-14, 2**-8) survive only in the 16-bit one."""
    rng = np.random.default_rng(5)
    logits = IntTensor(rng.integers(-127, 128, size=(64, 10)).astype(np.int8), -3)
    y = rng.integers(0, 10, 64)
    e8, p7 = softmax_cross_entropy_grad(logits, y)
    e16, p15 = softmax_cross_entropy_grad(logits, y, bits=16)
    assert e16.exp == -15 and e16.q.dtype == np.int16 and e8.q.dtype == np.int8
    onehot = np.eye(10, dtype=np.int64)[y]
    assert np.array_equal(e16.q, np.clip(p15 - (onehot << 15), -32767, 32767))
    z = logits.to_float()
    pf = np.exp(z - z.max(1, keepdims=True))
    pf /= pf.sum(1, keepdims=True)
    assert np.abs(p15 / 2**15 - pf).max() <= 2.5 / 128                    # the Q15 table's own accuracy
    assert np.abs(p15 / 2**15 - p7 / 2**7).max() <= 1 / 256 + 2**-15      # Q7 is Q15 rounded 8 bits coarser
    small = (pf > 2**-14) & (pf < 1 / 256) & (onehot == 0)
    assert small.any() and np.all(e8.q[small] == 0) and np.all(e16.q[small] > 0)


def test_sgd_update_is_a_shift_of_the_gradient():
    p = Param(np.zeros(4, dtype=np.int64), -10, 16)
    p.grad, p.grad_exp = np.array([96, -96, 32, 1000]), -8
    # step = grad * 2^(-8 - 4 - (-10)) = grad / 4 (rne): 24, -24, 8, 250
    SGD([p], lr_shift=4, rounding="rne").step()
    assert p.acc.tolist() == [-24, 24, -8, -250] and p.grad is None
    # left shift when the gradient exponent is large; saturation at the int16 range
    p.grad, p.grad_exp = np.array([1, -1, 2**20, 0]), 0
    SGD([p], lr_shift=4, rounding="rne").step()          # * 2^(0 - 4 + 10) = * 64
    assert p.acc.tolist() == [-88, 88, -32767, -250]


def _steps_of_a_constant_gradient(opt: SGD, p: Param, n: int = 3) -> list[int]:
    steps = []
    for _ in range(n):
        p.grad, p.grad_exp = np.array([8]), 0
        before = int(p.acc[0])
        opt.step()
        steps.append(before - int(p.acc[0]))
    return steps


def test_sgd_momentum():
    p = Param(np.zeros(1, dtype=np.int64), 0, 16)
    opt = SGD([p], lr_shift=0, momentum_shift=1, rounding="rne")   # beta = 1/2
    assert _steps_of_a_constant_gradient(opt, p) == [8, 12, 14]   # v = v - v/2 + 8


def test_sgd_nesterov_steps_the_gradient_plus_beta_times_the_new_momentum():
    p = Param(np.zeros(1, dtype=np.int64), 0, 16)
    opt = SGD([p], lr_shift=0, momentum_shift=1, rounding="rne", nesterov=True)    # beta = 1/2
    assert _steps_of_a_constant_gradient(opt, p) == [12, 14, 15]   # v = 8, 12, 14; step 8 + v / 2
    assert p.mom.tolist() == [14]
    assert opt.config()["nesterov"] is True
    with pytest.raises(ValueError, match="nesterov needs momentum_shift"):
        SGD([p], nesterov=True)


def test_exp2_vectorized_equals_scalar_definition():
    from inttrain.micro.ops import shift_round

    t = np.arange(-(64 << 8), 1)
    got = exp2_q15(t)
    tt = np.maximum(t, -(63 << 8))
    ref = np.array([int(shift_round(np.array([EXP2_LUT[v & 255]]), int(-(v >> 8)), "rne")[0]) for v in tt[::37]])
    assert np.array_equal(got[::37], ref)


def test_norm_rule_scales_the_largest_gradient_to_lr_bits():
    from inttrain.micro.optim import SGD as S

    p = Param(np.zeros(4, dtype=np.int64), -10, 16)
    # max |g| = 1000 -> bitlen 10; lr_bits 4 -> s = 6: 1000/64 = 15.625 -> 16, 96/64 = 1.5 -> 2 (even), -3/64 -> 0
    p.grad, p.grad_exp = np.array([1000, 96, -3, -640]), 123          # the gradient's exponent does not matter
    S([p], lr_mode="norm", lr_bits=4, rounding="rne").step()
    assert p.acc.tolist() == [-16, -2, 0, 10]
    # an all-zero gradient takes no step; a tiny one is shifted left (s < 0) up to 2**lr_bits
    p.grad = np.zeros(4, dtype=np.int32)
    S([p], lr_mode="norm", lr_bits=4, rounding="rne").step()
    assert p.acc.tolist() == [-16, -2, 0, 10]
    p.grad = np.array([1, 0, -1, 0])
    S([p], lr_mode="norm", lr_bits=4, rounding="rne").step()
    assert p.acc.tolist() == [-24, -2, 8, 10]


def test_schedule_multiplier_scales_the_step_in_q8():
    from inttrain.micro.optim import SGD as S

    p = Param(np.zeros(2, dtype=np.int64), 0, 16)
    opt = S([p], lr_mode="shift", lr_shift=0, rounding="rne")
    opt.multiplier = 64                                  # x 0.25: 100 * 64 / 256 = 25; 6 * 0.25 = 1.5 -> 2
    p.grad, p.grad_exp = np.array([100, 6]), 0
    opt.step()
    assert p.acc.tolist() == [-25, -2]


def test_schedules_are_integer_and_hit_their_ends():
    from inttrain.micro.optim import COS_Q8, COS_Q8_SUM, Schedule

    assert COS_Q8[0] == 256 and COS_Q8[128] == 128 and COS_Q8[256] == 0 and COS_Q8_SUM == 32896
    c = Schedule("cosine", total_steps=110, warmup_steps=10)
    assert [c.multiplier(t) for t in (0, 4, 9)] == [25, 128, 256]        # (t + 1) * 256 // 10
    assert c.multiplier(10) == 256 and c.multiplier(60) == 128 and c.multiplier(109) == COS_Q8[253]
    s = Schedule("step", total_steps=100, step_every=10)
    assert [s.multiplier(t) for t in (0, 9, 10, 25, 89, 95)] == [256, 256, 128, 64, 1, 0]
    assert Schedule("const").multiplier(10**6) == 256


def test_adapt_exp_halves_a_tensor_at_half_range_so_nothing_saturates():
    from inttrain.micro.optim import SGD as S, saturation

    p = Param(np.array([16000, -3, 5, 0]), -10, 16)
    opt = S([p], lr_mode="shift", lr_shift=0, rounding="rne", adapt_exp=True, momentum_shift=1)
    p.grad, p.grad_exp = np.array([-400, 0, 0, 0]), -10                # W -> 16400 >= 2**14: halve, exp + 1
    opt.step()
    assert p.exp == -9 and p.acc.tolist() == [8200, -2, 2, 0] and p.mom.tolist() == [-200, 0, 0, 0]
    # without adaptation the same push ends at the int16 limit
    q = Param(np.array([32000, 0]), -10, 16)
    q.grad, q.grad_exp = np.array([-2000, 0]), -10
    S([q], lr_mode="shift", lr_shift=0, rounding="rne").step()
    assert q.acc.tolist() == [32767, 0] and saturation([q]) == [(1, 2)]
    r = Param(np.array([32000, 0]), -10, 16)
    for _ in range(20):
        r.grad, r.grad_exp = np.array([-2000, 0]), r.exp
        S([r], lr_mode="shift", lr_shift=0, rounding="rne", adapt_exp=True).step()
    assert saturation([r]) == [(0, 2)] and int(r.acc[0]) < 1 << 14 and r.exp > -10


def test_decay_shrinks_toward_zero():
    from inttrain.micro.optim import SGD as S

    p = Param(np.array([1024, -1024, 3]), 0, 16)
    p.grad, p.grad_exp = np.zeros(3, dtype=np.int32), 0
    S([p], lr_mode="shift", lr_shift=0, rounding="rne", decay_shift=4).step()
    assert p.acc.tolist() == [960, -960, 3]                            # 1024 / 16 = 64; 3 / 16 rounds to 0


def test_frac_bits_adds_up_steps_below_one_code():
    """--frac-bits F: steps of 1/4, 1/2 and 3/4 code, each rounded to a whole code (rne), are lost or doubled;
    kept in a remainder of 2 fraction bits they add up to exactly 1, 2 and 3 codes after four steps."""
    from inttrain.micro.optim import SGD as S

    def run(**kw):
        p = Param(np.zeros(4, dtype=np.int16), 0, 16)
        opt = S([p], lr_mode="shift", lr_shift=2, rounding="rne", **kw)   # U = g / 4 codes
        for _ in range(4):
            p.grad, p.grad_exp = np.array([1, -1, 2, 3], dtype=np.int32), 0
            opt.step()
        return p
    assert run().acc.tolist() == [0, 0, 0, -4]           # 1/4 and 1/2 round to 0 (ties to even), 3/4 to 1
    p = run(frac_bits=2)
    assert p.acc.tolist() == [-1, 1, -2, -3] and p.frac.dtype == np.int16 and p.frac.tolist() == [0, 0, 0, 0]
    q = Param(np.zeros(2, dtype=np.int16), 0, 16)        # codes are rne of the whole value, remainder in +-2**(F-1)
    opt = S([q], lr_mode="shift", lr_shift=3, rounding="rne", frac_bits=3)
    q.grad, q.grad_exp = np.array([5, -3], dtype=np.int32), 0
    opt.step()                                           # -5/8 and +3/8 codes
    assert q.acc.tolist() == [-1, 0] and q.frac.tolist() == [3, 3]
    with pytest.raises(ValueError, match="frac_bits"):
        S([q], frac_bits=16)


def test_frac_bits_saturation_and_exponent_adaptation_act_on_the_whole_value():
    from inttrain.micro.optim import SGD as S

    p = Param(np.array([32767, 16383], dtype=np.int16), 0, 16)
    p.frac = np.array([0, 8], dtype=np.int16)            # 16383.5 codes with F = 4
    p.grad, p.grad_exp = np.array([-64, -8], dtype=np.int32), 0
    S([p], lr_mode="shift", lr_shift=4, rounding="rne", frac_bits=4).step()   # +4 and +0.5 codes
    assert p.acc.tolist() == [32767, 16384] and p.frac.tolist() == [0, 0] and p.exp == 0   # saturated, no remainder
    a = Param(np.array([16383, -5], dtype=np.int16), 0, 16)
    a.frac = np.array([8, 3], dtype=np.int16)
    a.grad, a.grad_exp = np.array([-8, 0], dtype=np.int32), 0
    S([a], lr_mode="shift", lr_shift=4, rounding="rne", frac_bits=4, adapt_exp=True).step()
    # 16384 codes reach half the range: the whole values halve, rne at 1/16 code (16384 -> 8192; -77/16 -> -38/16)
    assert a.exp == 1 and a.acc.tolist() == [8192, -2] and a.frac.tolist() == [0, -6]


def test_l2_shift_adds_lambda_w_to_the_gradient_in_its_units():
    """--l2-shift L: the step rule sees grad + 2**-L * W written at the gradient's exponent (a left shift when the
    gradient's units are finer than W's, an rne right shift when coarser), so the decay follows the lr."""
    from inttrain.micro.optim import SGD as S

    # W at exponent -10, gradient at -14 (16x finer), L = 2: W * 2**-2 in units of 2**-14 is W * 4
    p = Param(np.array([1000, -1000, 0, 7]), -10, 16)
    p.grad, p.grad_exp = np.array([0, 0, 40, 0], dtype=np.int32), -14
    opt = S([p], lr_mode="shift", lr_shift=0, rounding="rne", l2_shift=2)
    assert opt.gradient(p).tolist() == [4000, -4000, 40, 28]
    opt.step()                                    # lr 1: U = g * 2**(-14 + 10) = g / 16 (rne)
    assert p.acc.tolist() == [750, -750, -2, 5]  # 1000 - 250, 0 - round(2.5) = -2, 7 - round(1.75) = 5
    # coarser gradient units (exponent -6, 16x coarser than W's): W * 2**-2 / 16 = W / 64, rne
    q = Param(np.array([1000, 31, 32, 96]), -10, 16)
    q.grad, q.grad_exp = np.zeros(4, dtype=np.int32), -6
    assert S([q], lr_mode="shift", lr_shift=0, rounding="rne", l2_shift=2).gradient(q).tolist() == [16, 0, 0, 2]
    # off: the gradient is the gradient, and the norm rule normalises grad + lambda W
    r = Param(np.array([1000, -1000]), -10, 16)
    r.grad, r.grad_exp = np.array([3, 0], dtype=np.int32), -14
    assert S([r], lr_mode="norm", lr_bits=4).gradient(r) is r.grad
    n = S([r], lr_mode="norm", lr_bits=4, l2_shift=2)
    assert n.gradient(r).tolist() == [4003, -4000] and n.step_shift(r, n.gradient(r)) == 12 - 4
    with pytest.raises(ValueError, match="l2_shift"):
        S([r], l2_shift=31)
