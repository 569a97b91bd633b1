"""Residual addition with exponent alignment (§4.1) and integer range batch normalization (§4.2) in micro."""

import numpy as np
import pytest

from inttrain.micro import SGD, BatchNorm, IntTensor, MicroFormatError, Sequential, add_aligned, evaluate, train_epoch
from inttrain.micro.layers import Linear, Residual
from inttrain.micro.model import load_model, save_model
from inttrain.micro.ops import saturate, shift_round

C = lambda i, o, k=3, s=1, p=1: {"type": "conv2d", "in_channels": i, "out_channels": o, "kernel_size": k,  # noqa: E731
                                 "stride": s, "padding": p}
BN = lambda c: {"type": "batchnorm", "num_features": c}  # noqa: E731
R = {"type": "relu"}
SMALL = {"input_shape": [1, 8, 8], "layers": [
    C(1, 8), BN(8), R, {"type": "residual", "layers": [C(8, 8), BN(8), R, C(8, 8)]}, R,
    {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"},
    {"type": "linear", "in_features": 128, "out_features": 10}]}
PROJ = {"input_shape": [1, 8, 8], "layers": [
    C(1, 4), R, {"type": "residual", "layers": [C(4, 8, s=2), BN(8)], "shortcut": [C(4, 8, k=1, s=2, p=0)]},
    R, {"type": "flatten"}, {"type": "linear", "in_features": 128, "out_features": 10}]}


def test_add_aligned_rule():
    a, b = IntTensor(np.array([100, -3, 127], np.int8), -5), IntTensor(np.array([64, 7, 127], np.int8), -3)
    out = add_aligned(a, b, "rne")
    # a is shifted right by 2 (rne): 25, -1 (-0.75 -> -1), 32 (31.75); sums 89, 6, 159 -> requantize by 1 bit
    assert out.exp == -2 and out.q.tolist() == [44, 3, 80] and out.q.dtype == np.int8
    same = add_aligned(IntTensor(np.array([1, -2], np.int8), 0), IntTensor(np.array([3, 4], np.int8), 0))
    assert same.exp == 0 and same.q.tolist() == [4, 2]          # exact when it fits
    far = add_aligned(IntTensor(np.array([5], np.int8), -100), IntTensor(np.array([9], np.int8), 0))
    assert far.exp == 0 and far.q.tolist() == [9]                 # shifts >= 63 give 0


def test_add_aligned_close_to_real_sum():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = IntTensor(rng.integers(-127, 128, 64).astype(np.int8), int(rng.integers(-12, 0)))
        b = IntTensor(rng.integers(-127, 128, 64).astype(np.int8), int(rng.integers(-12, 0)))
        out = add_aligned(a, b, "rne")
        assert np.abs(out.to_float() - (a.to_float() + b.to_float())).max() <= 2.0 ** out.exp * 1.5


def test_bn_forward_normalizes_per_channel():
    rng = np.random.default_rng(1)
    x = np.clip(rng.normal(40, 20, size=(16, 3, 5, 5)).round() * np.array([1, 2, 0])[None, :, None, None], -127, 127)
    bn = BatchNorm(3)
    y = bn.forward(IntTensor(x.astype(np.int8), -7))
    xh = bn.saved[2]
    assert np.abs(xh).max() <= 127 and y.q.dtype == np.int8
    assert np.all(xh[2] == 0) and np.all(y.q[:, 2] == 0)         # a constant channel normalizes to beta = 0
    mean = y.to_float().mean(axis=(0, 2, 3))
    assert np.abs(mean[:2]).max() < 0.02                         # zero mean (beta = 0)
    # divided by the channel's range: |y| <= gamma = 1 and the spread is comparable
    assert y.to_float()[:, :2].std(axis=(0, 2, 3)).min() > 0.1


def _float_bn_grads(bn, g):
    """Float BN backward with the same statistics (the range r at the input exponent); the projection on the
    normalized input divides by sum(xf^2), as for a unit-variance input (docs §4.2)."""
    ex, shape, xh, r, k, g8 = bn.saved
    gc = np.moveaxis(g.to_float(), 1, 0).reshape(shape[1], -1)
    xf = xh / 128.0
    gamma = g8.q.astype(np.float64) * 2.0 ** (g8.exp + bn.gain_shift)
    sigma = np.maximum(r, 1).astype(np.float64) * 2.0 ** ex
    proj = (gc * xf).sum(1, keepdims=True) / np.maximum((xf * xf).sum(1, keepdims=True), 1e-300)
    gx = gamma[:, None] / sigma[:, None] * (gc - gc.mean(1, keepdims=True) - xf * proj)
    gx[r == 0] = 0
    return gx, (gc * xf).sum(1) * 2.0 ** bn.gain_shift, gc.sum(1)


@pytest.mark.parametrize("shape,gain_shift,g_bits", [((32, 6), 0, 8), ((8, 4, 6, 6), 0, 8), ((8, 4, 6, 6), 3, 8),
                                                     ((32, 6), 0, 16), ((8, 4, 6, 6), 3, 16)])
def test_bn_backward_matches_float_formula(shape, gain_shift, g_bits):
    """Int8 errors, and 16-bit ones (``error_bits`` 16: h at eg - 6 instead of eg - 14, 16-bit input error)."""
    rng = np.random.default_rng(2)
    x = rng.integers(-127, 128, size=shape) // rng.integers(1, 8, size=(1, shape[1]) + (1,) * (len(shape) - 2))
    bn = BatchNorm(shape[1], gain_shift=gain_shift)
    bn.err_bits = g_bits
    bn.gamma.acc[:] = rng.integers(2000, 8000, shape[1])
    bn.forward(IntTensor(x.astype(np.int8), -6))
    top = (1 << (g_bits - 1)) - 1
    g = IntTensor(rng.integers(-top, top + 1, size=shape).astype(np.int8 if g_bits == 8 else np.int16), -9)
    gx = bn.backward(g)
    assert gx.q.dtype == g.q.dtype
    ref_x, ref_gamma, ref_beta = _float_bn_grads(bn, g)
    got = np.moveaxis(gx.to_float(), 1, 0).reshape(shape[1], -1)
    cos = (got * ref_x).sum() / np.linalg.norm(got) / np.linalg.norm(ref_x)
    assert cos > 0.99, cos
    assert 0.95 < np.linalg.norm(got) / np.linalg.norm(ref_x) < 1.05
    assert np.array_equal(bn.gamma.grad * 2.0 ** bn.gamma.grad_exp, ref_gamma)   # exact sums
    assert np.array_equal(bn.beta.grad * 2.0 ** bn.beta.grad_exp, ref_beta)


@pytest.mark.parametrize("gain_shift", [1, 3])
def test_bn_gain_shift_scales_output_and_gradients_by_an_exact_power_of_two(gain_shift):
    """``gain_shift`` s (Banner et al.'s range correction as a power of two) only moves exponents: with beta = 0
    the output and input-error codes are those of s = 0 at exponent + s, dgamma is 2**s larger, dbeta unchanged;
    with a beta the output is 2**s * gamma * (x - mean) / range + beta."""
    rng = np.random.default_rng(4)
    x = IntTensor(rng.integers(-127, 128, size=(8, 4, 6, 6)).astype(np.int8), -6)
    g = IntTensor(rng.integers(-127, 128, size=(8, 4, 6, 6)).astype(np.int8), -9)
    plain, gained = BatchNorm(4), BatchNorm(4, gain_shift=gain_shift)
    gamma = rng.integers(2000, 8000, 4)
    plain.gamma.acc[:], gained.gamma.acc[:] = gamma, gamma
    y0, y1 = plain.forward(x), gained.forward(x)
    assert np.array_equal(y0.q, y1.q) and y1.exp == y0.exp + gain_shift
    gx0, gx1 = plain.backward(g), gained.backward(g)
    assert np.array_equal(gx0.q, gx1.q) and gx1.exp == gx0.exp + gain_shift
    assert np.array_equal(plain.gamma.grad, gained.gamma.grad)
    assert gained.gamma.grad_exp == plain.gamma.grad_exp + gain_shift
    assert np.array_equal(plain.beta.grad, gained.beta.grad) and gained.beta.grad_exp == plain.beta.grad_exp
    gained.beta.acc[:] = rng.integers(-3000, 3000, 4)
    y = gained.forward(x).to_float()
    xc = x.to_float()
    mean = xc.mean(axis=(0, 2, 3), keepdims=True)
    rng_ = xc.max(axis=(0, 2, 3), keepdims=True) - xc.min(axis=(0, 2, 3), keepdims=True)
    g8, b8 = gained.gamma.int8().to_float(), gained.beta.int8().to_float()
    ref = 2.0 ** gain_shift * g8[None, :, None, None] * (xc - mean) / rng_ + b8[None, :, None, None]
    assert np.abs(y - ref).max() < 0.03 * np.abs(ref).max()
    assert gained.describe() == {"type": "batchnorm", "num_features": 4, "gain_shift": gain_shift}
    assert plain.describe() == {"type": "batchnorm", "num_features": 4}


def test_bn_backward_16bit_errors_at_full_scale_stay_within_int32():
    """The worst 16-bit error (every code +-32767, a one-hot input channel so that Xh is concentrated) goes through
    the int32 checks of the input gradient; gamma / beta gradients beyond int32 are narrowed by a rounding shift."""
    x = np.zeros((128, 3, 32, 32), dtype=np.int8)           # M = 131072, ResNet-20's first stage at batch 128
    x[:, 0], x[0, 1, 0, 0], x[:, 2] = (np.arange(128)[:, None, None] * 2 - 127).astype(np.int8), 127, -90
    bn = BatchNorm(3)
    bn.err_bits = 16
    bn.gamma.acc[:] = 16000
    bn.forward(IntTensor(x, -6))
    sign = np.where(np.arange(x.size).reshape(x.shape) % 5 == 0, 32767, -32767).astype(np.int16)
    for g in (np.full_like(sign, 32767), sign):
        gx = bn.backward(IntTensor(g, -20))                          # no int32 overflow raised
        assert gx.q.dtype == np.int16 and np.all(gx.q[:, 2] == 0)   # a constant channel passes no error
        dbeta = g.astype(np.int64).sum(axis=(0, 2, 3))
        assert np.abs(dbeta).max() > 2**31 and bn.beta.grad.dtype == np.int32
        np.testing.assert_allclose(bn.beta.grad * 2.0 ** bn.beta.grad_exp, dbeta * 2.0 ** -20, rtol=2**-29)


def test_residual_backward_sums_both_paths():
    rng = np.random.default_rng(3)
    lin = Linear(16, 16, rng=rng, bwd_round="rne")
    res = Residual([lin], [], "rne", "rne")
    x = IntTensor(rng.integers(-127, 128, size=(8, 16)).astype(np.int8), -7)
    y = res.forward(x)
    ref_y = x.to_float() @ lin.weight.int8().to_float().T + x.to_float()
    assert np.abs(y.to_float() - ref_y).max() <= 2.0 ** y.exp * 2
    g = IntTensor(rng.integers(-127, 128, size=(8, 16)).astype(np.int8), -7)
    gx = res.backward(g)
    ref = g.to_float() @ lin.weight.int8().to_float() + g.to_float()
    assert np.abs(gx.to_float() - ref).max() <= 2.0 ** gx.exp * 2
    assert lin.weight.grad_exp == g.exp + x.exp and np.array_equal(lin.weight.grad, g.q.astype(np.int64).T @ x.q)


def test_descriptions_validated():
    Sequential.from_description(PROJ)
    bad = [
        {"input_shape": [1, 8, 8], "layers": [C(1, 4), BN(5), {"type": "flatten"},
                                              {"type": "linear", "in_features": 256, "out_features": 10}]},
        {"input_shape": [1, 8, 8], "layers": [{"type": "residual", "layers": [C(1, 4)]}, {"type": "flatten"},
                                              {"type": "linear", "in_features": 256, "out_features": 10}]},
        {"input_shape": [4], "layers": [{"type": "residual", "layers": []}]},
        {"input_shape": [4], "layers": [{"type": "residual", "layers": [R], "extra": 1}]},
        {"input_shape": [4], "layers": [{"type": "residual", "layers": [R], "shortcut": "x"}]},
    ]
    for desc in bad:
        with pytest.raises(MicroFormatError):
            Sequential.from_description(desc)
    with pytest.raises(ValueError, match="batch-statistics"):
        Sequential.from_description({"input_shape": [10], "layers": [BN(10)]}).check_batch(132105)
    Sequential.from_description({"input_shape": [10], "layers": [BN(10)]}).check_batch(132104)
    for gain in (-1, 9, True, "3", 2.0):
        with pytest.raises(MicroFormatError, match=r"'gain_shift' must be an integer in \[0, 8\]"):
            Sequential.from_description({"input_shape": [10], "layers": [{**BN(10), "gain_shift": gain}]})
    d = Sequential.from_description(PROJ).desc
    assert d["layers"][2]["shortcut"][0]["stride"] == 2 and d["layers"][2]["layers"][1] == BN(8)
    conv = {**C(1, 4), "out_bits": 16}
    for bits in (12, True, "16"):
        with pytest.raises(MicroFormatError, match=f"layer 0: out_bits must be 8 or 16, got {bits!r}"):
            Sequential.from_description({"input_shape": [1, 8, 8], "layers": [{**conv, "out_bits": bits}, BN(4)]})
    for after in ([R, BN(4)], []):
        with pytest.raises(MicroFormatError, match="layer 0: out_bits 16 needs a batchnorm as the next layer"):
            Sequential.from_description({"input_shape": [1, 8, 8], "layers": [conv, *after]})
    head = [{"type": "flatten"}, {"type": "linear", "in_features": 256, "out_features": 10}]
    wide = Sequential.from_description({"input_shape": [1, 8, 8],
                                        "layers": [conv, BN(4), {**C(4, 4), "out_bits": 8}, *head]})
    assert wide.desc["layers"][0]["out_bits"] == 16 and "out_bits" not in wide.desc["layers"][2]   # 8: not written
    for bits in (12, True, "16", None):
        with pytest.raises(MicroFormatError, match=f"model description: error_bits must be 8 or 16, got {bits!r}"):
            Sequential.from_description({**PROJ, "error_bits": bits})
    assert "error_bits" not in Sequential.from_description({**PROJ, "error_bits": 8}).desc      # 8: not written
    wide_errors = Sequential.from_description({**PROJ, "error_bits": 16})
    assert wide_errors.desc["error_bits"] == 16 and wide_errors.err_bits == 16
    assert {l.err_bits for l in wide_errors.layers} | {l.err_bits for l in wide_errors.layers[2].block} == {16}


def test_save_load_roundtrip(tmp_path):
    m = Sequential.from_description({**PROJ, "weight_bits": 8})
    x = np.random.default_rng(0).integers(0, 128, size=(64, 1, 8, 8)).astype(np.int8)
    train_epoch(m, SGD(m.params(), 8), x, -7, np.arange(64) % 10, 32)
    save_model(m, tmp_path / "r")
    back = load_model(tmp_path / "r")
    names = [n for n, _ in back.named_params()]
    assert "layers.2.block.1.gamma" in names and "layers.2.shortcut.0.weight" in names
    for (_, a), (_, b) in zip(m.named_params(), back.named_params()):
        assert np.array_equal(a.acc, b.acc) and a.exp == b.exp and b.acc.dtype == np.int8


def test_gain_shift_survives_save_and_load(tmp_path):
    desc = {**PROJ, "layers": [*PROJ["layers"][:2], {**PROJ["layers"][2], "layers": [C(4, 8, s=2), {**BN(8), "gain_shift": 3}]},
                               *PROJ["layers"][3:]]}
    m = Sequential.from_description(desc)
    assert m.desc["layers"][2]["layers"][1]["gain_shift"] == 3 and m.layers[2].block[1].gain_shift == 3
    save_model(m, tmp_path / "g")
    back = load_model(tmp_path / "g")
    assert back.layers[2].block[1].gain_shift == 3 and back.desc == m.desc


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.minimum(d.data * 8, 127).astype(np.int8).reshape(-1, 1, 8, 8)
    perm = np.random.default_rng(0).permutation(len(x))
    tr, te = perm[:1437], perm[1437:]
    return x[tr], x[te], d.target[tr], d.target[te]


def test_bn_residual_cnn_trains_on_digits(digits):
    """Measured: 0.511, 0.806, 0.861, 0.900 test accuracy after epochs 1-4 (lr 2**-8, batch 32)."""
    xtr, xte, ytr, yte = digits
    m = Sequential.from_description(SMALL)
    opt = SGD(m.params(), 8)
    for ep in range(4):
        train_epoch(m, opt, xtr, -7, ytr, 32, seed=ep)
    acc = evaluate(m, xte, -7, yte)
    assert acc > 0.85, acc


def test_projection_coefficient_divides_by_the_input_energy_and_is_capped():
    from inttrain.micro.layers import PROJ_CAP, projection_coefficient

    xh = np.array([[3, -5, 8, 0], [0, 0, 0, 0]], dtype=np.int64)
    g = np.array([[7, 1, -2, 4], [1, 2, 3, 4]], dtype=np.int64)
    dgamma = (g * xh).sum(1)                                         # [0, 0]... first row: 21 - 5 - 16 = 0
    assert projection_coefficient(dgamma, xh).tolist() == [0, 0]
    g[0] = [9, 1, 2, 4]                                              # sum(G Xh) = 27 - 5 + 16 = 38; sum(Xh^2) = 98
    pg = projection_coefficient((g * xh).sum(1), xh)
    assert pg.tolist() == [(38 * 16384 + 49) // 98, 0]               # rdiv(38 * 2**14, 98) = 6353
    # Xh concentrated on one large value among many small ones: the coefficient hits the int32-keeping cap
    xh = np.array([[32] + [1] * 9999], dtype=np.int64)
    g = np.full_like(xh, 127)
    pg = projection_coefficient((g * xh).sum(1), xh)
    assert pg.tolist() == [PROJ_CAP // 32] and int(np.abs(xh * pg[:, None]).max()) <= PROJ_CAP


def test_bn_16bit_input_256_times_an_int8_one_gives_the_same_codes():
    """A 16-bit input (a convolution's ``out_bits`` 16) goes through the wider reciprocal 2**31 / r and a shift by
    24: for 256 x an int8 input at exponent - 8 (the same values) that is exactly the int8 path (Xh, output,
    gradients); a channel too narrow for the int8 grid gets finer normalized values from its 16-bit codes."""
    rng = np.random.default_rng(5)
    half = rng.integers(-127, 128, size=(4, 4, 6, 6)) // rng.integers(1, 8, size=(1, 4, 1, 1))
    x = np.concatenate([half, -half])            # channel means 0 exactly (a 16-bit mean has 8 more bits)
    g = IntTensor(rng.integers(-127, 128, size=(8, 4, 6, 6)).astype(np.int8), -9)
    narrow, wide = BatchNorm(4, gain_shift=3), BatchNorm(4, gain_shift=3)
    y8 = narrow.forward(IntTensor(x.astype(np.int8), -6))
    y16 = wide.forward(IntTensor((x * 256).astype(np.int16), -14))
    assert np.array_equal(narrow.saved[2], wide.saved[2]) and y8.exp == y16.exp and np.array_equal(y8.q, y16.q)
    g8, g16 = narrow.backward(g), wide.backward(g)
    assert g16.exp == g8.exp and np.array_equal(g8.q, g16.q)      # the same values: the same error
    assert np.array_equal(narrow.gamma.grad, wide.gamma.grad) and np.array_equal(narrow.beta.grad, wide.beta.grad)
    fine = rng.normal(0, 300, size=(8, 1, 6, 6)).round().astype(np.int16)        # ~2 int8 codes of spread
    coarse = BatchNorm(1).forward(IntTensor(saturate(shift_round(fine.astype(np.int64), 8, "rne"), 8).astype(np.int8), 0))
    finer = BatchNorm(1).forward(IntTensor(fine, -8))
    assert len(np.unique(coarse.q)) < 16 < 64 < len(np.unique(finer.q))
