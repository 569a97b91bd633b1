"""Integer average pooling (docs §4.4): hand-built cases and bounded error against the float op."""

import numpy as np
import pytest

from inttrain.micro import MicroFormatError, Sequential
from inttrain.micro.layers import AvgPool2d, pool_shift
from inttrain.micro.ops import IntTensor


def _float_avgpool(x: np.ndarray, kh: int, kw: int) -> np.ndarray:
    n, c, h, w = x.shape
    oh, ow = h // kh, w // kw
    return x[:, :, :oh * kh, :ow * kw].reshape(n, c, oh, kh, ow, kw).mean(axis=(3, 5))


def test_pool_shift():
    assert [pool_shift(n) for n in (1, 2, 3, 4, 5, 9, 16, 25, 49, 64, 4096)] == [0, 1, 2, 2, 3, 4, 4, 5, 6, 6, 12]


def test_pow2_window_is_a_shift_hand_built():
    ap = AvgPool2d(2, fwd_round="rne", bwd_round="rne")
    x = IntTensor(np.array([[[[1, 2, 9], [3, 4, 9], [9, 9, 9]]]], dtype=np.int8), -3)   # trailing row/col dropped
    y = ap.forward(x)
    assert ap.last_acc.tolist() == [[[[10]]]] and y.exp == -5 and y.q.tolist() == [[[[10]]]]   # 10/4 at -3
    gx = ap.backward(IntTensor(np.array([[[[-7]]]], dtype=np.int8), -6))
    assert gx.exp == -8 and gx.q.tolist() == [[[[-7, -7, 0], [-7, -7, 0], [0, 0, 0]]]]     # g/4 exactly


def test_non_pow2_window_rdiv_hand_built():
    ap = AvgPool2d(3, fwd_round="rne", bwd_round="rne")
    x = IntTensor(np.full((1, 1, 3, 3), 127, dtype=np.int8), 0)
    y = ap.forward(x)                      # S = 1143, t = 4: A = rdiv(1143 * 16, 9) = 2032 = 127 * 16
    assert ap.last_acc.tolist() == [[[[2032]]]] and y.exp == 0 + 4 - 4 and y.q.tolist() == [[[[127]]]]
    gx = ap.backward(IntTensor(np.array([[[[100]]]], dtype=np.int8), -7))
    # B = rdiv(100 * 16, 9) = 178 at -11 -> requantized by one bit (rne): 89 at -10
    assert gx.exp == -10 and np.all(gx.q == 89)


@pytest.mark.parametrize("k,glob,shape", [(2, False, (3, 4, 9, 8)), (3, False, (2, 3, 10, 7)), (4, False, (2, 2, 8, 8)),
                                          (0, True, (3, 5, 7, 7)), (0, True, (2, 4, 4, 4)), (0, True, (2, 3, 5, 6))])
@pytest.mark.parametrize("mode", ["rne", "pstoch", "floor"])
def test_matches_float_avgpool_within_one_step(k, glob, shape, mode):
    rng = np.random.default_rng(k + len(shape) + shape[-1])
    ap = AvgPool2d(k, glob, mode, mode)
    x = IntTensor(rng.integers(-127, 128, size=shape).astype(np.int8), -6)
    y = ap.forward(x)
    kh, kw = (shape[2], shape[3]) if glob else (k, k)
    ref = _float_avgpool(x.to_float(), kh, kw)
    assert y.q.dtype == np.int8 and y.q.shape == ref.shape
    # the division's rdiv (<= 1/2 unit at ex - t) and the requantization (< 1 unit at the output exponent)
    assert np.all(np.abs(y.to_float() - ref) <= 2.0**y.exp + 0.5 * 2.0**(x.exp - pool_shift(kh * kw)))
    g = IntTensor(rng.integers(-127, 128, size=ref.shape).astype(np.int8), -7)
    gx = ap.backward(g)
    n, c, h, w = shape
    oh, ow = ref.shape[2:]
    gref = np.zeros(shape)
    gref[:, :, :oh * kh, :ow * kw] = np.repeat(np.repeat(g.to_float() / (kh * kw), kh, axis=2), kw, axis=3)
    assert gx.q.dtype == np.int8 and gx.q.shape == shape
    assert np.all(np.abs(gx.to_float() - gref) <= 2.0**gx.exp + 0.5 * 2.0**(g.exp - pool_shift(kh * kw)))
    if kh * kw == 1 << pool_shift(kh * kw):       # power-of-two window: the backward is exact
        assert np.array_equal(gx.to_float(), gref)


def test_description_and_training():
    desc = {"input_shape": [1, 8, 8], "layers": [
        {"type": "conv2d", "in_channels": 1, "out_channels": 4, "kernel_size": 3, "padding": 1}, {"type": "relu"},
        {"type": "avgpool2d", "kernel_size": 3}, {"type": "conv2d", "in_channels": 4, "out_channels": 6, "kernel_size": 1},
        {"type": "globalavgpool2d"}, {"type": "flatten"}, {"type": "linear", "in_features": 6, "out_features": 3}]}
    m = Sequential.from_description(desc)
    assert [l.describe() for l in m.layers][2] == {"type": "avgpool2d", "kernel_size": 3}
    assert m.layers[4].out_shape((6, 2, 2)) == (6, 1, 1)
    for bad in ({"type": "avgpool2d", "kernel_size": 9}, {"type": "avgpool2d", "kernel_size": 2, "stride": 1}):
        with pytest.raises(MicroFormatError):
            Sequential.from_description({**desc, "layers": [desc["layers"][0], bad, {"type": "flatten"},
                                                            {"type": "linear", "in_features": 64, "out_features": 3}]})
    with pytest.raises(MicroFormatError, match="globalavgpool2d"):
        Sequential.from_description({"input_shape": [1, 65, 64], "layers": [{"type": "globalavgpool2d"}, {"type": "flatten"}]})


def test_docs_example():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "integer-training.md").read_text()
    assert "### 4.4 Average pooling" in doc and "`A = rdiv(18288, 9) = 2032` at `-4`" in doc
