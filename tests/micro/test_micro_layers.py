import numpy as np
import pytest

from inttrain.micro.layers import Conv2d, Flatten, Linear, MaxPool2d, Param, ReLU, col2im, im2col
from inttrain.micro.ops import IntTensor, requantize


def _linear(w, exp, bits=8, fwd="rne", bwd="rne"):
    lin = Linear(w.shape[1], w.shape[0], bits=bits, fwd_round=fwd, bwd_round=bwd)
    lin.weight = Param(np.asarray(w), exp, bits)
    lin.params = [lin.weight]
    return lin


def test_linear_hand_built():
    lin = _linear(np.array([[1, 0], [0, -1], [2, 1]]), 0)
    y = lin.forward(IntTensor(np.array([[1, 2], [3, 4]], dtype=np.int8), -1))
    assert y.exp == -1 and y.q.tolist() == [[1, -2, 4], [3, -4, 10]]
    g = IntTensor(np.array([[1, 0, -1], [0, 2, 1]], dtype=np.int8), -7)
    gx = lin.backward(g)
    # dL/dx = g @ W = [[1-2, 0-1], [0+2, -2+1]] at exp -7 + 0
    assert gx.exp == -7 and gx.q.tolist() == [[-1, -1], [2, -1]]
    # dL/dW = g.T @ x at exp -7 + -1
    assert lin.weight.grad_exp == -8
    assert lin.weight.grad.tolist() == [[1, 2], [6, 8], [2, 2]]


def test_linear_large_accumulators_requantize():
    lin = _linear(np.full((1, 4), 127), 0)
    y = lin.forward(IntTensor(np.full((1, 4), 127, dtype=np.int8), 0))
    # 4 * 16129 = 64516, bitlen 16 -> shift 9: 126.0078 -> 126
    assert y.exp == 9 and y.q.tolist() == [[126]]


def test_linear_matches_float_reference():
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, size=(6, 20))
    lin = _linear(w, -7)
    x = IntTensor(rng.integers(-127, 128, size=(5, 20)).astype(np.int8), -5)
    y = lin.forward(x)
    yf = x.to_float() @ (w * 2.0**-7).T
    assert np.all(np.abs(y.to_float() - yf) <= 0.5 * 2.0**y.exp + 1e-12)     # rne: within half a step
    g = IntTensor(rng.integers(-127, 128, size=(5, 6)).astype(np.int8), -7)
    gx = lin.backward(g)
    assert np.allclose(lin.weight.grad * 2.0**lin.weight.grad_exp, g.to_float().T @ x.to_float(), rtol=0, atol=0)
    assert np.all(np.abs(gx.to_float() - g.to_float() @ (w * 2.0**-7)) <= 0.5 * 2.0**gx.exp + 1e-12)


def _conv_ref(x, w, stride, pad):
    n, c, h, wd = x.shape
    o, _, k, _ = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    out = np.zeros((n, o, oh, ow), dtype=np.int64)
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + k, j * stride:j * stride + k]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w.astype(np.int64))
    return out


@pytest.mark.parametrize("stride,pad,k", [(1, 0, 3), (2, 1, 3), (1, 2, 5), (3, 1, 2)])
def test_conv_forward_exact(stride, pad, k):
    rng = np.random.default_rng(stride * 10 + pad)
    x = rng.integers(-127, 128, size=(2, 3, 9, 8)).astype(np.int8)
    w = rng.integers(-127, 128, size=(4, 3, k, k)).astype(np.int8)
    assert np.array_equal(Conv2d.forward_acc(x, w, stride, pad), _conv_ref(x, w, stride, pad))


@pytest.mark.parametrize("stride,pad", [(1, 1), (2, 1), (2, 0)])
def test_conv_backward_is_exact_integer_derivative(stride, pad):
    """L(x, W) = sum(conv(x, W) * g) is bilinear: raising one code by 1 changes L by exactly the gradient."""
    rng = np.random.default_rng(stride + 5 * pad)
    x = rng.integers(-20, 21, size=(2, 2, 6, 5)).astype(np.int64)
    w = rng.integers(-20, 21, size=(3, 2, 3, 3)).astype(np.int64)
    base = Conv2d.forward_acc(x, w, stride, pad)
    g = rng.integers(-127, 128, size=base.shape)
    gx, gw = Conv2d.backward_acc(x, w, g, stride, pad)
    loss = lambda xx, ww: int((Conv2d.forward_acc(xx, ww, stride, pad) * g).sum())
    l0 = loss(x, w)
    for idx in np.ndindex(*x.shape):
        xe = x.copy()
        xe[idx] += 1
        assert loss(xe, w) - l0 == gx[idx]
    for idx in np.ndindex(*w.shape):
        we = w.copy()
        we[idx] += 1
        assert loss(x, we) - l0 == gw[idx]


def test_conv_layer_backward_uses_the_exact_accumulators():
    rng = np.random.default_rng(3)
    conv = Conv2d(2, 3, 3, stride=2, padding=1, bits=8, bwd_round="rne")
    x = IntTensor(rng.integers(-127, 128, size=(2, 2, 7, 7)).astype(np.int8), -7)
    conv.need_input_grad = True
    y = conv.forward(x)
    g = IntTensor(rng.integers(-127, 128, size=y.q.shape).astype(np.int8), -6)
    gx = conv.backward(g)
    w = conv.weight.int8()
    gxa, gwa = Conv2d.backward_acc(x.q, w.q, g.q, 2, 1)
    ref = requantize(gxa, g.exp + w.exp, "rne")
    assert gx.exp == ref.exp and np.array_equal(gx.q, ref.q)
    assert np.array_equal(conv.weight.grad, gwa) and conv.weight.grad_exp == g.exp + x.exp


def test_im2col_col2im_adjoint():
    rng = np.random.default_rng(4)
    x = rng.integers(-5, 6, size=(2, 3, 5, 6))
    cols, oh, ow = im2col(x, 3, 3, 2, 1)
    c = rng.integers(-5, 6, size=cols.shape)
    assert int((cols * c).sum()) == int((x * col2im(c, x.shape, 3, 3, 2, 1, oh, ow)).sum())


def test_relu_hand_built():
    r = ReLU()
    y = r.forward(IntTensor(np.array([[-3, 0, 5]], dtype=np.int8), 2))
    assert y.q.tolist() == [[0, 0, 5]] and y.exp == 2
    g = r.backward(IntTensor(np.array([[7, 8, 9]], dtype=np.int8), -7))
    assert g.q.tolist() == [[0, 0, 9]] and g.exp == -7


def test_maxpool_hand_built_ties_and_crop():
    mp = MaxPool2d(2)
    x = np.array([[[[1, 5, 2, 2, 9],
                    [5, 3, 2, 1, 9],
                    [0, 0, -1, -2, 9],
                    [0, 7, -3, -1, 9],
                    [9, 9, 9, 9, 9]]]], dtype=np.int8)
    y = mp.forward(IntTensor(x, -3))
    assert y.exp == -3 and y.q.tolist() == [[[[5, 2], [7, -1]]]]
    g = mp.backward(IntTensor(np.array([[[[10, 20], [30, 40]]]], dtype=np.int8), -7))
    assert g.q.tolist() == [[[[0, 10, 20, 0, 0],        # ties: first maximum in row-major order
                              [0, 0, 0, 0, 0],
                              [0, 0, 40, 0, 0],
                              [0, 30, 0, 0, 0],
                              [0, 0, 0, 0, 0]]]]


def test_flatten_round_trip():
    f = Flatten()
    x = np.arange(24, dtype=np.int8).reshape(2, 3, 2, 2)
    y = f.forward(IntTensor(x, 0))
    assert y.q.shape == (2, 12)
    assert np.array_equal(f.backward(IntTensor(y.q, -7)).q, x)


def test_int16_master_weights_int8_view():
    p = Param(np.array([32767, -32767, 384, 128, -128, 127]), -15, 16)
    v = p.int8()
    # /256 rne: 127.996 -> 128 -> 127; 1.5 -> 2; 0.5 -> 0; -0.5 -> -0; 0.496 -> 0
    assert v.exp == -7 and v.q.tolist() == [127, -127, 2, 0, 0, 0]
