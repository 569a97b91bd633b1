"""Bit-exact parity of the PyTorch integer-only engine with the NumPy engine inttrain.micro.

From the same initial integer weights, data and order, every training step must give identical
logits, int32 accumulators, integer softmax, loss gradient, weight gradients, momentum and weights.
"""

import math

import numpy as np
import pytest
import torch
from micro_utils import CNN, MLP
from parity_utils import int_equal as _eq

from inttrain import integer_only as T
from inttrain import micro as M
from inttrain.micro.loss import display_loss as micro_display_loss

# stride 2, no padding, an odd map for the pool (trailing row/col dropped), two convs (conv input error)
CNN2 = {"input_shape": [1, 8, 8], "seed": 3, "layers": [
    {"type": "conv2d", "in_channels": 1, "out_channels": 4, "kernel_size": 3, "stride": 1, "padding": 1},
    {"type": "relu"},
    {"type": "conv2d", "in_channels": 4, "out_channels": 6, "kernel_size": 3, "stride": 2, "padding": 2},
    {"type": "relu"}, {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"},
    {"type": "linear", "in_features": 24, "out_features": 10}]}


def _micro_acc(layer) -> np.ndarray:
    if isinstance(layer, M.Linear):
        x, w = layer.saved
        return M.Linear.forward_acc(x.q, w.q)
    x, w, *_ = layer.saved
    return M.Conv2d.forward_acc(x.q, w.q, layer.stride, layer.padding)


def _assert_same_weights(mm, tm):
    for (n, mp), (_, tp) in zip(mm.named_params(), tm.named_params()):
        assert mp.exp == tp.exp and mp.bits == tp.bits
        assert tp.acc.dtype == (torch.int16 if mp.bits == 16 else torch.int8)
        assert _eq(tp.acc, mp.acc), n
        assert (mp.mom is None) == (tp.mom is None)
        if mp.mom is not None:
            assert tp.mom.dtype == torch.int32 and _eq(tp.mom, mp.mom), n
        assert (mp.frac is None) == (tp.frac is None)
        if mp.frac is not None:
            assert tp.frac.dtype == torch.int16 and _eq(tp.frac, mp.frac), n


def _lockstep(desc, data, steps, lr_shift, momentum_shift=None, batch=32, schedule=None, **opt_kw):
    """Train both engines ``steps`` steps from one initialization, comparing everything after each step.
    ``schedule``: a micro Schedule setting both optimizers' multiplier per step; ``opt_kw``: SGD options."""
    xtr, _, ytr, _ = data
    xs = xtr.reshape((len(xtr), *desc["input_shape"]))
    mm = M.Sequential.from_description(desc)
    tm = T.Sequential.from_micro(mm)
    _assert_same_weights(mm, tm)
    mo = M.SGD(mm.params(), lr_shift, momentum_shift, rounding=mm.desc["rounding"]["update"], **opt_kw)
    to = T.SGD(tm.params(), lr_shift, momentum_shift, rounding=tm.desc["rounding"]["update"], **opt_kw)
    order = np.random.default_rng(1).permutation(len(xs))
    gemm_layers = [(ml, tl) for ml, tl in zip(mm.layers, tm.layers) if hasattr(ml, "weight")]
    for step in range(steps):
        idx = order[(step * batch) % len(xs):][:batch]
        xb, yb = xs[idx], ytr[idx]
        mlog = mm.forward(M.IntTensor(xb, -7))
        tlog = tm.forward(T.IntTensor(torch.from_numpy(xb), -7))
        assert tlog.q.dtype == torch.int8 and mlog.exp == tlog.exp and _eq(tlog.q, mlog.q)
        for ml, tl in gemm_layers:                       # every GEMM layer's forward accumulator
            assert tl.last_acc.dtype == torch.int32 and _eq(tl.last_acc, _micro_acc(ml))
        merr, mp = M.softmax_cross_entropy_grad(mlog, yb, bits=mm.err_bits)
        terr, tp = T.softmax_cross_entropy_grad(tlog, torch.from_numpy(yb), tm.err_bits)
        assert _eq(tp, mp) and merr.exp == terr.exp == 1 - mm.err_bits               # Q7, or Q15 for 16-bit errors
        assert terr.q.dtype == (torch.int8 if tm.err_bits == 8 else torch.int16) and _eq(terr.q, merr.q)
        assert math.isclose(T.loss.display_loss(tlog, torch.from_numpy(yb)), micro_display_loss(mlog, yb),
                            rel_tol=1e-12, abs_tol=1e-12)
        mm.backward(merr)
        tm.backward(terr)
        for ml, tl in gemm_layers:
            assert ml.weight.grad_exp == tl.weight.grad_exp
            assert tl.weight.grad.dtype == torch.int32 and _eq(tl.weight.grad, ml.weight.grad)
        if schedule is not None:
            mo.multiplier = to.multiplier = schedule.multiplier(step)
        mo.step()
        to.step()
        _assert_same_weights(mm, tm)
    return mm, tm


@pytest.mark.parametrize("bits,momentum", [(16, None), (8, None), (16, 2)])
def test_mlp_lockstep_20_steps(digits, bits, momentum):
    _lockstep({**MLP, "weight_bits": bits}, digits, 20, 8 if momentum else 6, momentum)


@pytest.mark.parametrize("rounding", [{"forward": "hstoch", "backward": "hstoch", "update": "hstoch"},
                                      {"forward": "pstoch", "backward": "rne", "update": "floor"},
                                      {"forward": "floor", "backward": "floor", "update": "rne"}])
def test_mlp_lockstep_other_rounding_modes(digits, rounding):
    _lockstep({**MLP, "rounding": rounding}, digits, 10, 6)


@pytest.mark.parametrize("desc", [CNN, CNN2], ids=["cnn", "cnn-stride-pad"])
def test_cnn_lockstep_20_steps(digits, desc):
    _lockstep(desc, digits, 20, 6)


def test_cnn_hashed_rounding_lockstep(digits):
    """hstoch hashes each value's flat position: the torch engine's convolutions must round at micro's."""
    _lockstep({**CNN2, "rounding": {"forward": "hstoch", "backward": "hstoch", "update": "hstoch"}}, digits, 8, 6)


@pytest.mark.parametrize("backward", ["hstoch", "pstoch", "rne"])
def test_cnn_16bit_errors_lockstep(digits, backward):
    """error_bits 16 (docs §4.5) with each backward rounding: the int8 GEMM operand is rounded from the 16-bit error
    at the same positions in both engines."""
    _lockstep({**CNN2, "error_bits": 16, "rounding": {"forward": "rne", "backward": backward, "update": "pstoch"}},
              digits, 8, 6)


def test_cnn_int8_weights_with_momentum_lockstep(digits):
    _lockstep({**CNN, "weight_bits": 8}, digits, 12, 8, momentum_shift=3)


@pytest.mark.parametrize("desc,kw", [
    (MLP, {"lr_mode": "norm", "lr_bits": 14, "adapt_exp": True}),
    (CNN2, {"lr_mode": "norm", "lr_bits": 12, "adapt_exp": True, "momentum_shift": 2, "decay_shift": 6}),
    ({**MLP, "weight_bits": 8}, {"lr_mode": "norm", "lr_bits": 5, "adapt_exp": True, "momentum_shift": 1}),
    (MLP, {"lr_mode": "shift", "lr_shift": 2, "adapt_exp": True}),
    (CNN2, {"lr_mode": "norm", "lr_bits": 14, "adapt_exp": True, "l2_shift": 2}),
    (CNN2, {"lr_mode": "norm", "lr_bits": 14, "adapt_exp": True, "frac_bits": 8}),
    (MLP, {"lr_mode": "norm", "lr_bits": 14, "adapt_exp": True, "frac_bits": 15, "momentum_shift": 3,
           "decay_shift": 9}),
    (CNN2, {"lr_mode": "shift", "lr_shift": 2, "adapt_exp": True, "momentum_shift": 3, "nesterov": True,
            "l2_shift": 4, "frac_bits": 8})],
    ids=["mlp-norm", "cnn-norm-mom-decay", "mlp-int8-norm", "mlp-shift-adapt", "cnn-norm-l2", "cnn-norm-frac8",
         "mlp-norm-frac15-mom-decay", "cnn-shift-nesterov-l2-frac8"])
def test_norm_rule_schedule_and_exponent_adaptation_lockstep(digits, desc, kw):
    """The CLI's default update (norm rule, cosine multiplier with warm-up, adapted exponents) and its options:
    bit-exact in both engines, exponents included; the large steps make the exponents move."""
    from inttrain.micro.optim import Schedule

    lr_shift = kw.pop("lr_shift", 6)
    mm, tm = _lockstep(desc, digits, 16, lr_shift, schedule=Schedule("cosine", 16, 4), **dict(kw))
    init = M.Sequential.from_description(desc)
    assert any(p.exp != q.exp for p, q in zip(mm.params(), init.params())), "no exponent was adapted"


def test_large_lr_saturates_identically(digits):
    """lr_shift 0: huge steps, weights pinned at the saturation bounds in both engines."""
    mm, tm = _lockstep({**MLP, "weight_bits": 8}, digits, 5, 0)
    assert int(tm.params()[0].acc.abs().max()) == 127


@pytest.mark.parametrize("desc,epochs", [(MLP, 2), (CNN, 1)], ids=["mlp", "cnn"])
def test_train_epoch_parity_and_same_accuracy(digits, desc, epochs):
    """Whole epochs through the public loops (micro's shuffling order): same weights, same accuracy."""
    xtr, xte, ytr, yte = digits
    shp = desc["input_shape"]
    xs, xt = xtr.reshape((len(xtr), *shp)), xte.reshape((len(xte), *shp))
    mm = M.Sequential.from_description(desc)
    tm = T.Sequential.from_description(desc)         # same description -> same initial integer weights
    _assert_same_weights(mm, tm)
    mo, to = M.SGD(mm.params(), 6), T.SGD(tm.params(), 6)
    for ep in range(epochs):
        ml, ma = M.train_epoch(mm, mo, xs, -7, ytr, 32, seed=ep)
        tl, ta = T.train_epoch(tm, to, xs, -7, ytr, 32, seed=ep)
        assert ma == ta and math.isclose(ml, tl, rel_tol=1e-12)
        _assert_same_weights(mm, tm)
    assert np.array_equal(T.predict(tm, xt, -7).numpy(), M.model.predict(mm, xt, -7))
    assert T.evaluate(tm, xt, -7, yte) == M.evaluate(mm, xt, -7, yte)


def test_crop_flip_epochs_stay_bit_exact(digits):
    """--augment crop-flip draws the same crops in both engines: same weights after every epoch, and the
    augmented run differs from the plain one."""
    xtr, _, ytr, _ = digits
    xs = xtr.reshape(-1, 1, 8, 8)
    mm, plain = M.Sequential.from_description(CNN), M.Sequential.from_description(CNN)
    tm = T.Sequential.from_micro(mm)
    mo, to, po = M.SGD(mm.params(), 6), T.SGD(tm.params(), 6), M.SGD(plain.params(), 6)
    for ep in range(2):
        ml, ma = M.train_epoch(mm, mo, xs, -7, ytr, 32, seed=ep, augment="crop-flip")
        tl, ta = T.train_epoch(tm, to, xs, -7, ytr, 32, seed=ep, augment="crop-flip")
        M.train_epoch(plain, po, xs, -7, ytr, 32, seed=ep)
        assert ma == ta and math.isclose(ml, tl, rel_tol=1e-12)
        _assert_same_weights(mm, tm)
    assert any(not np.array_equal(p.acc, q.acc) for p, q in zip(mm.params(), plain.params()))


def test_default_recipe_update_trains_both_engines_identically(digits):
    """The recipe's default optimizer (norm rule, adapted exponents) with a cosine schedule through both public
    epoch loops: the same weights and exponents every epoch, and the CNN learns (measured: 0.922 after 3 epochs)."""
    from inttrain.micro.optim import Schedule
    from inttrain.recipes.integer_only import IntegerOnlyConfig, optimizer

    xtr, xte, ytr, yte = digits
    xs, xt = xtr.reshape(-1, 1, 8, 8), xte.reshape(-1, 1, 8, 8)
    mm = M.Sequential.from_description(CNN)
    tm = T.Sequential.from_micro(mm)
    cfg = IntegerOnlyConfig()
    to = optimizer(tm, cfg)
    mo = M.SGD(mm.params(), cfg.lr_shift, cfg.momentum_shift, mm.desc["rounding"]["update"], lr_mode=cfg.lr_mode,
               lr_bits=cfg.lr_bits, adapt_exp=cfg.adapt_exp, decay_shift=cfg.decay_shift)
    spe = -(-len(xs) // 32)
    sched = Schedule("cosine", 3 * spe, spe // 4)
    for ep in range(3):
        ml, ma = M.train_epoch(mm, mo, xs, -7, ytr, 32, seed=ep, schedule=sched, global_step=ep * spe)
        tl, ta = T.train_epoch(tm, to, xs, -7, ytr, 32, seed=ep, schedule=sched, global_step=ep * spe)
        assert ma == ta and math.isclose(ml, tl, rel_tol=1e-12)
        _assert_same_weights(mm, tm)
    acc = T.evaluate(tm, xt, -7, yte)
    assert acc == M.evaluate(mm, xt, -7, yte) and acc > 0.9, acc


def test_reaches_micro_accuracy_on_digits(digits):
    """5 epochs, int16 master weights, lr 2**-6 (docs: 0.975): torch reaches exactly micro's accuracy."""
    xtr, xte, ytr, yte = digits
    mm = M.Sequential.from_description(MLP)
    tm = T.Sequential.from_micro(mm)
    mo, to = M.SGD(mm.params(), 6), T.SGD(tm.params(), 6)
    for ep in range(5):
        M.train_epoch(mm, mo, xtr, -7, ytr, 32, seed=ep)
        T.train_epoch(tm, to, torch.from_numpy(xtr), -7, torch.from_numpy(ytr), 32, seed=ep)
    acc_t, acc_m = T.evaluate(tm, xte, -7, yte), M.evaluate(mm, xte, -7, yte)
    assert acc_t == acc_m
    assert acc_t > 0.9, acc_t


def test_to_micro_roundtrip_and_save(digits, tmp_path):
    xtr, _, ytr, _ = digits
    tm = T.Sequential.from_description(MLP)
    T.train_epoch(tm, T.SGD(tm.params(), 6), xtr[:128], -7, ytr[:128], 32)
    M.save_model(tm.to_micro(), tmp_path / "run")
    back = T.Sequential.from_micro(M.load_model(tmp_path / "run"))
    assert all(torch.equal(a.acc, b.acc) and a.exp == b.exp for a, b in zip(tm.params(), back.params()))
