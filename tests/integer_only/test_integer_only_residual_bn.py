"""Residual additions (§4.1) and integer batch normalization (§4.2): bit-exact parity with micro, training,
save/load in micro's file format."""

import numpy as np
import pytest
import torch
from parity_utils import int_equal as _eq
from hypothesis import given, settings
from hypothesis import strategies as st

from inttrain import integer_only as T
from inttrain import micro as M

C = lambda i, o, k=3, s=1, p=1: {"type": "conv2d", "in_channels": i, "out_channels": o, "kernel_size": k,  # noqa: E731
                                 "stride": s, "padding": p}
BN = lambda c: {"type": "batchnorm", "num_features": c}  # noqa: E731
R = {"type": "relu"}
# BN, an identity residual with BN inside, a projection residual (stride-2 3x3 vs stride-2 1x1 shortcut)
RESNET = {"input_shape": [1, 8, 8], "layers": [
    C(1, 8), BN(8), R,
    {"type": "residual", "layers": [C(8, 8), BN(8), R, C(8, 8)]}, R,
    {"type": "residual", "layers": [C(8, 16, s=2), BN(16)], "shortcut": [C(8, 16, k=1, s=2, p=0)]}, R,
    {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"},
    {"type": "linear", "in_features": 64, "out_features": 10}]}
# the model trained to the accuracy threshold (measured: 0.90 test accuracy after 4 epochs at lr 2**-8)
SMALL = {"input_shape": [1, 8, 8], "layers": [
    C(1, 8), BN(8), R, {"type": "residual", "layers": [C(8, 8), BN(8), R, C(8, 8)]}, R,
    {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"},
    {"type": "linear", "in_features": 128, "out_features": 10}]}
# BN on (N, F) features, and a residual as the very first layer (no input error needed)
MLP_BN = {"input_shape": [64], "layers": [
    {"type": "residual", "layers": [{"type": "linear", "in_features": 64, "out_features": 64}, BN(64)]}, R,
    {"type": "linear", "in_features": 64, "out_features": 32}, BN(32), R,
    {"type": "linear", "in_features": 32, "out_features": 10}]}


def _flat(layers):
    for l in layers:
        yield l
        if isinstance(l, (M.Residual, T.Residual)):
            yield from _flat(l.block)
            yield from _flat(l.shortcut)


def _same_params(mm, tm):
    mn, tn = mm.named_params(), tm.named_params()
    assert [n for n, _ in mn] == [n for n, _ in tn]
    for (n, mp), (_, tp) in zip(mn, tn):
        assert mp.exp == tp.exp and mp.bits == tp.bits and _eq(tp.acc, mp.acc), n
        assert (mp.mom is None) == (tp.mom is None)
        if mp.mom is not None:
            assert _eq(tp.mom, mp.mom), n


def _lockstep(desc, data, steps, lr_shift, momentum_shift=None, batch=32, **opt_kw):
    xtr, _, ytr, _ = data
    xs = xtr.reshape((len(xtr), *desc["input_shape"]))
    mm = M.Sequential.from_description(desc)
    tm = T.Sequential.from_micro(mm)
    _same_params(mm, tm)
    mo = M.SGD(mm.params(), lr_shift, momentum_shift, rounding=mm.desc["rounding"]["update"], **opt_kw)
    to = T.SGD(tm.params(), lr_shift, momentum_shift, rounding=tm.desc["rounding"]["update"], **opt_kw)
    order = np.random.default_rng(1).permutation(len(xs))
    pairs = list(zip(_flat(mm.layers), _flat(tm.layers)))
    for step in range(steps):
        idx = order[(step * batch) % len(xs):][:batch]
        xb, yb = xs[idx], ytr[idx]
        mlog = mm.forward(M.IntTensor(xb, -7))
        tlog = tm.forward(T.IntTensor(torch.from_numpy(xb), -7))
        assert tlog.q.dtype == torch.int8 and mlog.exp == tlog.exp and _eq(tlog.q, mlog.q)
        for ml, tl in pairs:
            if isinstance(ml, M.BatchNorm):                      # the int32 BN accumulator
                assert _eq(tl.last_acc, ml.last_acc)
                assert _eq(tl.saved[2], ml.saved[2]) and _eq(tl.saved[4], ml.saved[4])   # Xh, k
        merr, _ = M.softmax_cross_entropy_grad(mlog, yb, bits=mm.err_bits)
        terr, _ = T.softmax_cross_entropy_grad(tlog, torch.from_numpy(yb), tm.err_bits)
        assert merr.exp == terr.exp and _eq(terr.q, merr.q)
        mm.backward(merr)
        tm.backward(terr)
        for (n, mp), (_, tp) in zip(mm.named_params(), tm.named_params()):
            assert mp.grad_exp == tp.grad_exp, n
            assert tp.grad.dtype == torch.int32 and _eq(tp.grad, mp.grad), n
        mo.step()
        to.step()
        _same_params(mm, tm)
    return mm, tm


@pytest.mark.parametrize("bits,momentum", [(16, None), (8, 3)])
def test_resnet_bn_lockstep(digits, bits, momentum):
    _lockstep({**RESNET, "weight_bits": bits}, digits, 8, 8, momentum)


def _with_gain(layers, shift):
    """The layers with every batch norm's ``gain_shift`` set (residuals recursed)."""
    out = []
    for spec in layers:
        if spec["type"] == "batchnorm":
            spec = {**spec, "gain_shift": shift}
        elif spec["type"] == "residual":
            spec = {**spec, "layers": _with_gain(spec["layers"], shift), "shortcut": _with_gain(spec.get("shortcut", []), shift)}
        out.append(spec)
    return out


def test_resnet_bn_gain_shift_lockstep(digits):
    _lockstep({**RESNET, "layers": _with_gain(RESNET["layers"], 3)}, digits, 6, 8, 2, lr_mode="norm", lr_bits=10)


def _with_wide_bn_inputs(layers):
    """The layers with every convolution that feeds a batch norm set to 16-bit output codes (residuals recursed)."""
    out = []
    for i, spec in enumerate(layers):
        if spec["type"] == "conv2d" and i + 1 < len(layers) and layers[i + 1]["type"] == "batchnorm":
            spec = {**spec, "out_bits": 16}
        elif spec["type"] == "residual":
            spec = {**spec, "layers": _with_wide_bn_inputs(spec["layers"]),
                    "shortcut": _with_wide_bn_inputs(spec.get("shortcut", []))}
        out.append(spec)
    return out


def test_resnet_bn_16bit_inputs_lockstep(digits):
    """Convolutions handing their batch norms 16-bit codes (``out_bits``: 16): bit-exact in both engines, and the
    batch norms really see 16-bit values (channel ranges beyond the 254 of int8 codes) in both."""
    desc = {**RESNET, "layers": _with_wide_bn_inputs(_with_gain(RESNET["layers"], 3))}
    mm, tm = _lockstep(desc, digits, 6, 8, 2, lr_mode="norm", lr_bits=10)
    assert sum(isinstance(l, M.Conv2d) and l.out_bits == 16 for l in _flat(mm.layers)) == 3
    assert sum(isinstance(l, T.Conv2d) and l.out_bits == 16 for l in _flat(tm.layers)) == 3
    x = digits[0][:16].reshape(16, 1, 8, 8)
    mm.forward(M.IntTensor(x, -7))
    tm.forward(T.IntTensor(torch.from_numpy(x), -7))
    bns = [(ml, tl) for ml, tl in zip(_flat(mm.layers), _flat(tm.layers)) if isinstance(ml, M.BatchNorm)]
    assert len(bns) == 3
    for ml, tl in bns:
        assert int(ml.saved[3].max()) > 254 and _eq(tl.saved[3], ml.saved[3])      # the channels' ranges r


@pytest.mark.parametrize("desc", [RESNET, MLP_BN], ids=["resnet", "mlp-bn"])
def test_16bit_errors_lockstep(digits, desc):
    """``error_bits`` 16: every layer hands back 16-bit error codes (int8 only as GEMM operands), the loss
    gradient is int16 at exponent -15; bit-exact in both engines, and the errors really are 16-bit in both."""
    desc = {**desc, "error_bits": 16, "layers": _with_gain(desc["layers"], 3)}
    mm, tm = _lockstep(desc, digits, 6, 8, 2, lr_mode="norm", lr_bits=10)
    assert mm.err_bits == tm.err_bits == 16 and mm.desc["error_bits"] == 16
    xtr, _, ytr, _ = digits
    xb = xtr[:16].reshape((16, *desc["input_shape"]))
    for model, engine, conv in ((mm, M, np.asarray), (tm, T, torch.from_numpy)):
        seen = []
        for layer in _flat(model.layers):                        # record each layer's output error
            layer.backward = (lambda f: lambda g: seen.append(r := f(g)) or r)(layer.backward)
        logits = model.forward(engine.IntTensor(conv(xb), -7))
        err, _ = engine.softmax_cross_entropy_grad(logits, conv(ytr[:16]), bits=16)
        assert err.exp == -15 and str(err.q.dtype).endswith("int16")
        model.backward(err)
        errors = [g for g in seen if g is not None]
        assert errors and all(str(g.q.dtype).endswith("int16") for g in errors)
        assert max(int(abs(g.q).max()) for g in errors) > 127                     # wider than int8 codes


@pytest.mark.parametrize("desc", [RESNET, MLP_BN], ids=["resnet", "mlp-bn"])
def test_tensor_weight_view_lockstep(digits, desc):
    """``weight_view`` "tensor" (with 16-bit errors, adapt_exp): every int16 master tensor's int8 view takes its own
    shift, bitlen(max|W16|) - 7, so its largest code is 64..127 (the fixed shift of 8 gives these fresh weights at
    most 32); bit-exact in both engines, views and exponents included."""
    desc = {**desc, "error_bits": 16, "weight_view": "tensor", "layers": _with_gain(desc["layers"], 3)}
    mm, tm = _lockstep(desc, digits, 6, 8, 2, lr_mode="norm", lr_bits=10, adapt_exp=True)
    assert mm.desc["weight_view"] == "tensor"
    for mp, tp in zip(mm.params(), tm.params()):
        assert mp.view == tp.view == "tensor"
        v, tv = mp.int8(), tp.int8()
        am = int(np.abs(mp.acc.astype(np.int64)).max())
        assert v.exp == tv.exp == mp.exp + max(0, am.bit_length() - 7)
        assert _eq(tv.q, v.q) and 64 <= int(np.abs(v.q.astype(np.int64)).max()) <= 127
    fixed = M.Sequential.from_description({**desc, "weight_view": "fixed"})
    assert "weight_view" not in fixed.desc and max(int(np.abs(p.int8().q).max()) for p in fixed.params()) <= 32


def test_norm_rule_with_a_separate_batch_norm_step_stays_in_lockstep(digits):
    _lockstep(RESNET, digits, 6, 8, 2, lr_mode="norm", lr_bits=10, bn_lr_bits=8, adapt_exp=True)


@pytest.mark.parametrize("engine", [M, T])
def test_bn_lr_bits_shrinks_only_the_batch_norm_steps(engine, digits):
    """bn_lr_bits = lr_bits - 1 halves the steps of gamma / beta (one more bit of shift) and nothing else."""
    xtr, _, ytr, _ = digits
    model = engine.Sequential.from_description(RESNET)
    x = xtr[:32].reshape(-1, 1, 8, 8)
    logits = model.forward(engine.IntTensor(x if engine is M else torch.from_numpy(x), -7))
    err, _ = engine.softmax_cross_entropy_grad(logits, ytr[:32] if engine is M else torch.from_numpy(ytr[:32]))
    model.backward(err)
    plain = engine.SGD(model.params(), 8, lr_mode="norm", lr_bits=10)
    split = engine.SGD(model.params(), 8, lr_mode="norm", lr_bits=10, bn_lr_bits=9)
    roles = {p.role for p in model.params()}
    assert roles == {"weight", "norm"}
    for p in model.params():
        if plain.step_shift(p) is None:
            continue
        assert split.step_shift(p) == plain.step_shift(p) + (p.role == "norm"), p.role
    assert split.config()["bn_lr_bits"] == 9 and plain.config()["bn_lr_bits"] is None
    with pytest.raises(ValueError, match=r"bn_lr_bits must be in \[0, 14\]"):
        engine.SGD(model.params(), 8, lr_mode="norm", bn_lr_bits=15)


def test_mlp_bn_first_layer_residual_lockstep(digits):
    _lockstep({**MLP_BN, "rounding": {"forward": "pstoch", "backward": "rne", "update": "floor"}}, digits, 8, 8)


def test_resnet_bn_hashed_rounding_lockstep(digits):
    """hstoch in batch norm's channel-major arrays and the residual adds: both engines round at one position."""
    _lockstep({**RESNET, "rounding": {"forward": "hstoch", "backward": "hstoch", "update": "hstoch"}}, digits, 6, 8, 2)


@given(st.integers(-127, 127), st.integers(-127, 127), st.integers(-70, 70), st.integers(-70, 70),
       st.sampled_from(["rne", "pstoch", "floor"]))
@settings(max_examples=150, deadline=None)
def test_add_aligned_matches_micro(a, b, ea, eb, mode):
    qa, qb = np.array([a, -b, 127, 0], np.int8), np.array([b, a, 127, -127], np.int8)
    m = M.add_aligned(M.IntTensor(qa, ea), M.IntTensor(qb, eb), mode)
    t = T.add_aligned(T.IntTensor(torch.from_numpy(qa), ea), T.IntTensor(torch.from_numpy(qb), eb), mode)
    assert m.exp == t.exp and t.q.dtype == torch.int8 and _eq(t.q, m.q)


def test_train_epoch_parity(digits):
    """A whole epoch through both public loops gives identical weights and predictions (the accuracy of
    this model, 0.90 after 4 epochs at lr 2**-8, is tested on micro in tests/micro)."""
    xtr, xte, ytr, yte = digits
    xs, xt = xtr.reshape(-1, 1, 8, 8), xte.reshape(-1, 1, 8, 8)
    mm = M.Sequential.from_description(SMALL)
    tm = T.Sequential.from_description(SMALL)
    mo, to = M.SGD(mm.params(), 8), T.SGD(tm.params(), 8)
    ml, ma = M.train_epoch(mm, mo, xs, -7, ytr, 32, seed=0)
    tl, ta = T.train_epoch(tm, to, xs, -7, ytr, 32, seed=0)
    assert ma == ta
    _same_params(mm, tm)
    assert np.array_equal(T.predict(tm, xt, -7).numpy(), M.model.predict(mm, xt, -7))


def test_save_load_both_ways(digits, tmp_path):
    xtr, _, ytr, _ = digits
    tm = T.Sequential.from_description(RESNET)
    T.train_epoch(tm, T.SGD(tm.params(), 8, 2), xtr[:96].reshape(-1, 1, 8, 8), -7, ytr[:96], 32)
    tm.save(tmp_path / "t", extra={"note": "torch"})
    mm = M.load_model(tmp_path / "t")                          # micro loads what torch saved
    for (n, mp), (n2, tp) in zip(mm.named_params(), tm.named_params()):
        assert n == n2 and mp.exp == tp.exp and _eq(tp.acc, mp.acc)
    M.save_model(mm, tmp_path / "m", extra={"note": "torch"})  # byte-identical files from micro's save
    for f in ("model.json", "weights.safetensors"):
        assert (tmp_path / "t" / f).read_bytes() == (tmp_path / "m" / f).read_bytes()
    back = T.Sequential.load(tmp_path / "m")                  # and torch loads what micro saved
    for (_, a), (_, b) in zip(tm.named_params(), back.named_params()):
        assert torch.equal(a.acc, b.acc) and a.exp == b.exp
    from safetensors.numpy import load_file                  # the reference reader agrees
    ref = load_file(str(tmp_path / "t" / "weights.safetensors"))
    assert sorted(ref) == sorted(n for n, _ in tm.named_params())
    for n, p in tm.named_params():
        assert np.array_equal(ref[n], p.acc.numpy())


def test_training_step_with_bn_residual_is_integer_only():
    from tests.integer_only.test_integer_only_no_float import DtypeRecorder

    model = T.Sequential.from_description(RESNET)
    opt = T.SGD(model.params(), 8, 2)
    rng = np.random.default_rng(0)
    x = T.IntTensor(torch.from_numpy(rng.integers(0, 128, size=(4, 1, 8, 8)).astype(np.int8)), -7)
    y = torch.from_numpy(rng.integers(0, 10, size=4))
    T.train_step(model, opt, x, y)
    rec = DtypeRecorder()
    with rec:
        T.train_step(model, opt, x, y)
    assert not [(op, dt) for op, dt in rec.seen if dt.is_floating_point or dt.is_complex]
