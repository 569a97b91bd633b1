import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inttrain.micro.ops import hashed_round, requantize, saturate, shift_left_saturate, shift_round


def test_rne_hand_cases():
    x = np.array([5, 7, -5, -7, 6, 10, 3, -3, 4, -4])
    # 2.5->2, 3.5->4, -2.5->-2, -3.5->-4, 3->3, 5->5, 1.5->2, -1.5->-2, 2->2, -2->-2
    assert shift_round(x, 1, "rne").tolist() == [2, 4, -2, -4, 3, 5, 2, -2, 2, -2]
    # /4: 6 -> 1.5 -> 2, 10 -> 2.5 -> 2, 11 -> 2.75 -> 3, -6 -> -2, -10 -> -2, -9 -> -2.25 -> -2
    assert shift_round(np.array([6, 10, 11, -6, -10, -9]), 2, "rne").tolist() == [2, 2, 3, -2, -2, -2]
    assert shift_round(np.array([-7]), 1, "floor").tolist() == [-4]
    assert shift_round(np.array([2**62, -(2**62)]), 63).tolist() == [0, 0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**50), 2**50), min_size=1, max_size=20), st.integers(0, 40))
def test_rne_matches_numpy_round_half_even(xs, s):
    x = np.array(xs, dtype=np.int64)
    ref = np.round(x.astype(np.float64) / 2.0**s)        # exact division by a power of two; np.round is half-even
    assert np.array_equal(shift_round(x, s, "rne"), ref.astype(np.int64))


def test_pseudo_stochastic_rule_and_bias():
    # s = 4: top 2 discarded bits u, bottom 2 bits v, round up iff u > v
    x = np.arange(0, 16)
    u, v = (x >> 2) & 3, x & 3
    assert np.array_equal(shift_round(x, 4, "pstoch"), (u > v).astype(np.int64))
    # deterministic, no RNG: same input, same output
    r = np.random.default_rng(0).integers(-(2**20), 2**20, size=5000)
    assert np.array_equal(shift_round(r, 8, "pstoch"), shift_round(r, 8, "pstoch"))
    # roughly unbiased over many values: mean error well below the 0.5 of truncation
    err = shift_round(r, 8, "pstoch") - r / 256.0
    assert abs(err.mean()) < 0.05
    # s == 1 has no random bits: falls back to round half to even
    assert np.array_equal(shift_round(r, 1, "pstoch"), shift_round(r, 1, "rne"))


def _lowbias32(h: int) -> int:  # Chris Wellons' hash in plain uint32 arithmetic, as the C runtime computes it
    h ^= h >> 16
    h = (h * 0x7FEB352D) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x846CA68B) & 0xFFFFFFFF
    return h ^ (h >> 16)


def _hstoch_reference(x: int, s: int, at: int) -> int:
    u = _lowbias32(((x & 0xFFFFFFFF) ^ ((at * 0x9E3779B9) & 0xFFFFFFFF)) ^ ((s * 0x9E3779B9) & 0xFFFFFFFF))
    r = x & ((1 << s) - 1)
    return (x >> s) + ((u >> (32 - s)) < r if s <= 32 else u < (r >> (s - 32)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=20), st.integers(1, 62))
def test_hashed_rounding_matches_uint32_reference(xs, s):
    """The int64 emulation (split second multiplier) gives exactly the uint32 hash of the C runtime."""
    x = np.array(xs, dtype=np.int64)
    assert shift_round(x, s, "hstoch").tolist() == [_hstoch_reference(v, s, i) for i, v in enumerate(xs)]


def test_hashed_rounding_is_unbiased_positional_and_reproducible():
    # errors below half a step: rne sends them all to 0, hstoch rounds them up at the rate r / 2**s
    for value, s in ((1, 4), (3, 3), (-5, 6), (100, 10)):
        x = np.full(1 << 16, value, dtype=np.int64)
        y = shift_round(x, s, "hstoch")
        assert set(np.unique(y).tolist()) == {value >> s, (value >> s) + 1}   # equal values, positions differ
        assert abs(y.mean() - value / 2**s) < 0.01, (value, s, y.mean())
    assert not shift_round(np.full(1 << 16, 1), 4, "rne").any()                # what rne does to them
    r = np.random.default_rng(0).integers(-(2**20), 2**20, size=(50, 100))
    y = shift_round(r, 8, "hstoch")
    assert np.array_equal(y, shift_round(r, 8, "hstoch"))                   # no generator state
    assert np.array_equal(y.reshape(-1), shift_round(r.reshape(-1), 8, "hstoch"))   # the flat position counts
    assert abs((y - r / 256.0).mean()) < 0.01
    assert np.array_equal(shift_round(r << 8, 8, "hstoch"), r)                # nothing discarded: exact
    assert np.array_equal(requantize(r.astype(np.float64), 0, "hstoch").q, requantize(r, 0, "hstoch").q)
    # the int32 fast path (requantize's accumulators) rounds exactly as the int64 one, for every shift
    r32 = r.astype(np.int32)
    for s in range(1, 32):
        assert np.array_equal(hashed_round(r32, s), shift_round(r32.astype(np.int64), s, "hstoch")), s
    assert hashed_round(r32, 5).dtype == np.int32
    wide = np.array([2**45 + 12345, -(2**44) - 7, 3], dtype=np.int64)  # a shift past 32 bits: the int64 hash
    t = requantize(wide, 0, "hstoch")
    assert t.exp == 39 and np.array_equal(t.q, saturate(shift_round(wide, 39, "hstoch")))


def test_saturation_and_left_shift():
    assert saturate(np.array([-300, -128, 0, 127, 128])).tolist() == [-127, -127, 0, 127, 127]
    assert shift_left_saturate(np.array([3, -3, 2**40]), 4, 100).tolist() == [48, -48, 100]
    assert shift_left_saturate(np.array([1, -1, 0]), 70).tolist() == [2**31 - 1, -(2**31 - 1), 0]


def test_requantize_shift_and_saturation():
    acc = np.array([255, -100, 3])
    t = requantize(acc, -10)
    # bitlen(255) = 8 -> s = 1: 127.5 -> 128 (half to even) -> saturated to 127; -50; 1.5 -> 2
    assert t.exp == -9 and t.q.dtype == np.int8 and t.q.tolist() == [127, -50, 2]
    small = requantize(np.array([100, -127]), 3)
    assert small.exp == 3 and small.q.tolist() == [100, -127]
    z = requantize(np.zeros(4, dtype=np.int64), 5)
    assert z.exp == 5 and z.q.tolist() == [0, 0, 0, 0]


def test_unknown_mode():
    with pytest.raises(ValueError):
        shift_round(np.array([1]), 1, "up")
