"""Integer average pooling (docs §4.4): torch twin == micro bit for bit, bounded error against torch's float op."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from parity_utils import int_equal as _eq
from test_integer_only_parity import _lockstep

from inttrain import integer_only as T
from inttrain import micro as M

# avgpool 2 (power of two: pure shift), avgpool 3 (rdiv) on a 7x7 map with a dropped row/col, global pool
CNN_AVG = {"input_shape": [1, 8, 8], "seed": 5, "layers": [
    {"type": "conv2d", "in_channels": 1, "out_channels": 6, "kernel_size": 3, "padding": 1}, {"type": "relu"},
    {"type": "avgpool2d", "kernel_size": 2},
    {"type": "conv2d", "in_channels": 6, "out_channels": 8, "kernel_size": 3, "padding": 1}, {"type": "relu"},
    {"type": "flatten"}, {"type": "linear", "in_features": 128, "out_features": 10}]}
CNN_AVG3_GAP = {"input_shape": [1, 8, 8], "seed": 2, "layers": [
    {"type": "conv2d", "in_channels": 1, "out_channels": 8, "kernel_size": 2}, {"type": "relu"},
    {"type": "avgpool2d", "kernel_size": 3},
    {"type": "conv2d", "in_channels": 8, "out_channels": 12, "kernel_size": 1}, {"type": "relu"},
    {"type": "globalavgpool2d"}, {"type": "flatten"}, {"type": "linear", "in_features": 12, "out_features": 10}]}


@pytest.mark.parametrize("desc", [CNN_AVG, CNN_AVG3_GAP, {**CNN_AVG3_GAP, "error_bits": 16}],
                         ids=["avg2", "avg3-global", "avg3-global-16bit-errors"])
def test_avgpool_cnn_lockstep(digits, desc):
    _lockstep(desc, digits, 15, 6)


def test_avgpool_cnn_int8_momentum_other_rounding_lockstep(digits):
    _lockstep({**CNN_AVG3_GAP, "weight_bits": 8, "rounding": {"forward": "pstoch", "backward": "rne", "update": "rne"}},
              digits, 8, 8, momentum_shift=2)


def test_avgpool_cnn_train_epoch_parity(digits):
    xtr, xte, ytr, yte = digits
    xs, xt = xtr.reshape(-1, 1, 8, 8), xte.reshape(-1, 1, 8, 8)
    mm, tm = M.Sequential.from_description(CNN_AVG), T.Sequential.from_description(CNN_AVG)
    mo, to = M.SGD(mm.params(), 6), T.SGD(tm.params(), 6)
    ml, ma = M.train_epoch(mm, mo, xs, -7, ytr, 32)
    tl, ta = T.train_epoch(tm, to, xs, -7, ytr, 32)
    assert ma == ta
    assert all(_eq(tp.acc, mp.acc) for mp, tp in zip(mm.params(), tm.params()))
    assert np.array_equal(T.predict(tm, xt, -7).numpy(), M.model.predict(mm, xt, -7))
    assert T.evaluate(tm, xt, -7, yte) > 0.5


@pytest.mark.parametrize("k,glob", [(1, False), (2, False), (3, False), (5, False), (4, False), (0, True)])
@pytest.mark.parametrize("mode", ["rne", "pstoch", "floor"])
def test_op_parity_and_float_reference(k, glob, mode):
    rng = np.random.default_rng(k * 7 + glob)
    shape = (3, 4, 11, 10)
    xq = rng.integers(-127, 128, size=shape).astype(np.int8)
    mp, tp = M.AvgPool2d(k, glob, mode, mode), T.AvgPool2d(k, glob, mode, mode)
    my, ty = mp.forward(M.IntTensor(xq, -5)), tp.forward(T.IntTensor(torch.from_numpy(xq), -5))
    assert ty.q.dtype == torch.int8 and ty.exp == my.exp and _eq(ty.q, my.q) and _eq(tp.last_acc, mp.last_acc)
    gq = rng.integers(-127, 128, size=my.q.shape).astype(np.int8)
    mg, tg = mp.backward(M.IntTensor(gq, -7)), tp.backward(T.IntTensor(torch.from_numpy(gq), -7))
    assert tg.q.dtype == torch.int8 and tg.exp == mg.exp and _eq(tg.q, mg.q)
    # against torch's float avg_pool2d / its autograd on the dequantized values
    kh, kw = (shape[2], shape[3]) if glob else (k, k)
    t = T.layers.pool_shift(kh * kw)
    xf = torch.from_numpy(xq).double().mul(2.0**-5).requires_grad_()
    yf = F.avg_pool2d(xf, (kh, kw))
    assert torch.all((ty.to_float() - yf.detach()).abs() <= 2.0**ty.exp + 0.5 * 2.0**(-5 - t))
    yf.backward(torch.from_numpy(gq).double() * 2.0**-7)
    assert torch.all((tg.to_float() - xf.grad).abs() <= 2.0**tg.exp + 0.5 * 2.0**(-7 - t))


def test_recipe_converts_avg_pools():
    from torch import nn

    from inttrain.recipes.integer_only import convert

    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.ReLU(), nn.AvgPool2d(2),
                        nn.Conv2d(4, 6, 3, padding=1, bias=False), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(6, 10, bias=False))
    tm = convert(net, input_shape=[1, 8, 8])
    assert [s["type"] for s in tm.desc["layers"]] == ["conv2d", "relu", "avgpool2d", "conv2d", "globalavgpool2d",
                                                      "flatten", "linear"]
    with pytest.raises(ValueError, match="non-overlapping"):
        convert(nn.Sequential(nn.AvgPool2d(2, stride=1), nn.Flatten()), input_shape=[1, 4, 4])
    with pytest.raises(ValueError):
        convert(nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten()), input_shape=[1, 4, 4])


def test_avgpool_step_creates_only_integer_tensors():
    from test_integer_only_no_float import DtypeRecorder

    model = T.Sequential.from_description(CNN_AVG3_GAP)
    opt = T.SGD(model.params(), 5)
    rng = np.random.default_rng(0)
    x = T.IntTensor(torch.from_numpy(rng.integers(0, 128, size=(8, 1, 8, 8)).astype(np.int8)), -7)
    y = torch.from_numpy(rng.integers(0, 10, size=8))
    T.train_step(model, opt, x, y)
    rec = DtypeRecorder()
    with rec:
        T.train_step(model, opt, x, y)
    assert not [(op, dt) for op, dt in rec.seen if dt.is_floating_point or dt.is_complex]
