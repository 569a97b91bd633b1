"""Generated C training code (inttrain.micro.codegen) against micro, bit for bit.

Invariant: after every step of training in C and in micro on the same batches, every logit code and exponent
and every master weight code is identical, and so are the predictions afterwards (``run_check``). Each model
also has to move its weights (``changed > 0``), so identity is not the trivial identity of untrained codes.
"""

import json
import re

import numpy as np
import pytest

from inttrain.micro import Sequential
from inttrain.micro.__main__ import main
from inttrain.micro.codegen import find_cc, generate, run_check
from inttrain.micro.codegen import check as check_mod
from inttrain.micro.ops import ROUNDING_MODES

needs_cc = pytest.mark.skipif(find_cc() is None, reason="no C compiler (cc/gcc/clang) on PATH")

C = lambda i, o, k=3, s=1, p=1: {"type": "conv2d", "in_channels": i, "out_channels": o, "kernel_size": k,  # noqa: E731
                                 "stride": s, "padding": p}
BN = lambda c: {"type": "batchnorm", "num_features": c}  # noqa: E731
R = {"type": "relu"}
MLP = {"input_shape": [16], "layers": [{"type": "linear", "in_features": 16, "out_features": 12}, R,
                                       {"type": "linear", "in_features": 12, "out_features": 5}]}
CNN = {"input_shape": [1, 12, 12], "layers": [             # max pool, a 3x3 (non-power-of-two) average pool, stride 2
    C(1, 4), R, {"type": "maxpool2d", "kernel_size": 2}, {"type": "avgpool2d", "kernel_size": 3},
    C(4, 6, s=2), R, {"type": "flatten"}, {"type": "linear", "in_features": 6, "out_features": 5}]}
BN_RES = {"input_shape": [1, 8, 8], "layers": [
    C(1, 8), BN(8), R, {"type": "residual", "layers": [C(8, 8), BN(8), R, C(8, 8)]}, R,
    {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"}, {"type": "linear", "in_features": 128, "out_features": 5}]}
BN_RES_GAIN = {**BN_RES, "layers": [C(1, 8), {**BN(8), "gain_shift": 3}, R,    # batch norms scaled by 2**gain_shift
                                     {"type": "residual", "layers": [C(8, 8), {**BN(8), "gain_shift": 2}, R, C(8, 8)]},
                                     *BN_RES["layers"][4:]]}
# every convolution that feeds a batch norm hands it 16-bit codes (out_bits 16), gains set, projection shortcut
BN_WIDE = {"input_shape": [1, 8, 8], "layers": [
    {**C(1, 8), "out_bits": 16}, {**BN(8), "gain_shift": 3}, R,
    {"type": "residual", "layers": [{**C(8, 8), "out_bits": 16}, {**BN(8), "gain_shift": 3}, R, C(8, 8)]}, R,
    {"type": "residual", "layers": [{**C(8, 16, s=2), "out_bits": 16}, BN(16)],
     "shortcut": [{**C(8, 16, k=1, s=2, p=0), "out_bits": 16}, BN(16)]}, R,
    {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"}, {"type": "linear", "in_features": 64, "out_features": 5}]}
PROJ = {"input_shape": [1, 9, 9], "layers": [              # residual first (no input error), projection shortcut, global pool
    {"type": "residual", "layers": [C(1, 4), R], "shortcut": [C(1, 4, k=1, p=0)]}, C(4, 4), R,
    {"type": "residual", "layers": [C(4, 8, s=2), BN(8)], "shortcut": [C(4, 8, k=1, s=2, p=0)]}, R,
    {"type": "globalavgpool2d"}, {"type": "flatten"}, {"type": "linear", "in_features": 8, "out_features": 5}]}
E16 = lambda desc: {**desc, "error_bits": 16}  # noqa: E731  - 16-bit errors between layers (Q15 loss gradient)
TV = lambda desc: {**desc, "weight_view": "tensor"}  # noqa: E731  - each int16 tensor's own int8-view shift (§1)


def _data(shape, n=30, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(-127, 128, size=(n, *shape)).astype(np.int8), rng.integers(0, classes, n)


def _check(desc, steps=5, batch=8, lr=3, mom=None, x_exp=-7, data=None, prepare=None, **kw):
    """run_check on ``desc``'s seeded model; ``prepare(model)``: changes its initial codes (both copies)."""
    x, y = data if data is not None else _data(desc["input_shape"])

    def load():
        m = Sequential.from_description(desc)
        if prepare is not None:
            prepare(m)
        return m

    return run_check(load, x, x_exp, y, steps, batch, lr, mom, **kw)


def _rescale(ks):
    """A ``prepare``: the i-th master tensor's codes times 2**-ks[i] (floor; ks[i] < 0: up, saturated at +-32767),
    so that a tensor view's shifts spread over 0..8 (fresh int16 tensors: s = 6)."""
    def prepare(model):
        for (_, p), k in zip(model.named_params(), ks):
            a = p.acc.astype(np.int64)
            p.acc[:] = np.clip(a >> k if k >= 0 else a << -k, -32767, 32767)
    return prepare


@needs_cc
@pytest.mark.parametrize("name,desc,mom,low_ram", [
    ("mlp", MLP, None, False), ("mlp_low_ram", MLP, None, True), ("cnn", CNN, None, False),
    ("cnn_momentum_low_ram", CNN, 2, True), ("bn_residual", BN_RES, None, False),
    ("bn_residual_low_ram", BN_RES, None, True), ("bn_residual_gain", BN_RES_GAIN, 2, False),
    ("projection", PROJ, 2, False), ("bn_16bit_inputs", BN_WIDE, 2, False),
    ("bn_16bit_inputs_low_ram", BN_WIDE, None, True),
    ("e16_mlp", E16(MLP), None, False), ("e16_mlp_momentum_low_ram", E16(MLP), 2, True),
    ("e16_cnn", E16(CNN), None, False),
    ("e16_cnn_momentum_low_ram", E16(CNN), 2, True), ("e16_bn_residual", E16(BN_RES), None, False),
    ("e16_bn_residual_momentum_low_ram", E16(BN_RES), 2, True), ("e16_bn_residual_gain", E16(BN_RES_GAIN), 2, False),
    ("e16_projection", E16(PROJ), 2, False), ("e16_projection_low_ram", E16(PROJ), None, True),
    ("e16_bn_16bit_inputs", E16(BN_WIDE), 2, False), ("e16_bn_16bit_inputs_low_ram", E16(BN_WIDE), None, True),
    ("tensor_view_cnn_momentum_low_ram", TV(CNN), 2, True), ("tensor_view_bn_residual", TV(BN_RES), None, False),
    ("tensor_view_bn_residual_gain", TV(BN_RES_GAIN), 2, False), ("tensor_view_bn_16bit_inputs", TV(BN_WIDE), 2, False),
    ("e16_tensor_view_bn_residual_momentum_low_ram", E16(TV(BN_RES)), 2, True),
    ("e16_tensor_view_bn_16bit_inputs", E16(TV(BN_WIDE)), None, False)])
def test_codegen_bit_exact(name, desc, mom, low_ram):
    r = _check(desc, mom=mom, low_ram=low_ram)
    assert r.ok, r.message
    assert r.message.startswith("C and micro identical") and r.changed > 0
    assert r.sizes["buffers"] > 0 and r.sizes["params"] > 0


@needs_cc
def test_codegen_other_roundings_int8_weights_constant_channel():
    """pstoch forward / floor backward / rne update, 8-bit weights, a BN as the first layer (no input error), a
    constant input channel (range 0), a flatten-then-BN over 108 features, batch 3 with a shorter last batch."""
    desc = {"input_shape": [2, 6, 6], "weight_bits": 8,
            "rounding": {"forward": "pstoch", "backward": "floor", "update": "rne"},
            "layers": [BN(2), C(2, 3), R, {"type": "flatten"}, BN(108),
                       {"type": "linear", "in_features": 108, "out_features": 4}]}
    x, y = _data((2, 6, 6), n=20, classes=4, seed=1)
    x[:, 1] = 5
    r = _check(desc, steps=7, batch=3, lr=2, x_exp=-3, data=(x, y))
    assert r.ok, r.message
    assert r.changed > 0


@needs_cc
@pytest.mark.parametrize("name,desc,low_ram", [
    ("cnn", CNN, False), ("cnn_low_ram", CNN, True), ("bn_residual", BN_RES, False),
    ("bn_residual_low_ram", BN_RES, True), ("projection", PROJ, False), ("bn_16bit_inputs_low_ram", BN_WIDE, True),
    ("e16_mlp", E16(MLP), False), ("e16_cnn_low_ram", E16(CNN), True), ("e16_bn_residual", E16(BN_RES), False),
    ("e16_bn_residual_low_ram", E16(BN_RES), True), ("e16_projection", E16(PROJ), False),
    ("e16_bn_16bit_inputs", E16(BN_WIDE), False), ("e16_bn_16bit_inputs_low_ram", E16(BN_WIDE), True)])
def test_codegen_hashed_rounding_bit_exact(name, desc, low_ram):
    """hstoch everywhere: the C runtime hashes each value with the position the NumPy engine rounds it at (the
    channel-major batch-norm arrays, the non-power-of-two average pool's error, requantizing without an
    accumulator, the weight updates; with 16-bit errors also the int8 GEMM operand a linear or conv layer rounds
    its error to), so the two agree bit for bit."""
    desc = {**desc, "rounding": {"forward": "hstoch", "backward": "hstoch", "update": "hstoch"}}
    r = _check(desc, steps=6, mom=2 if name.endswith("projection") or name.endswith("16bit_inputs") else None,
               low_ram=low_ram)
    assert r.ok, r.message
    assert r.changed > 0


@needs_cc
@pytest.mark.parametrize("old,new,pattern", [
    ("int64_t u = it_shift(grad, s, mode, at), v;",
     "int64_t u = it_shift(grad, s, mode == IT_PSTOCH ? IT_FLOOR : mode, at), v;",
     r"step 1: layers\.\d\.weight differs first at index \(\d+, \d+\): C -?\d+, micro -?\d+"),
    ("int32_t s = requant_shift(amax32(acc, n));", "int32_t s = requant_shift(amax32(acc, n)) + 1;",
     r"step 1: logits exponent differs: C -?\d+, micro -?\d+"),
])
def test_codegen_check_names_first_difference(monkeypatch, old, new, pattern):
    """A runtime that rounds the update differently, or requantizes one bit too far, is caught at step 1."""
    real = check_mod.generate

    def tampered(*a, **kw):
        gen = real(*a, **kw)
        assert old in gen.files["inttrain_rt.c"]
        gen.files["inttrain_rt.c"] = gen.files["inttrain_rt.c"].replace(old, new)
        return gen

    monkeypatch.setattr(check_mod, "generate", tampered)
    r = _check(MLP, lr=2)
    assert not r.ok and re.fullmatch(pattern, r.message), r.message


@needs_cc
@pytest.mark.parametrize("backward", ["rne", "hstoch"])
def test_codegen_16bit_errors_narrow_batchnorm_gradients(monkeypatch, backward):
    """With 16-bit errors a batch norm sums its gamma and beta gradients in int64 and narrows each channel vector
    to int32 by a rounding shift (docs §4.2). Here (M = 2048 x 64 values per channel, every error +-32258 and of
    the sign of its sample's offset) both shifts are taken at step 1, and C and micro still agree bit for bit."""
    from inttrain.micro.layers import BatchNorm

    shifts = []
    real = BatchNorm.backward

    def recording(self, g):
        out = real(self, g)
        shifts.append((self.beta.grad_exp - g.exp, self.gamma.grad_exp - (g.exp - 7 + self.gain_shift)))
        return out

    monkeypatch.setattr(BatchNorm, "backward", recording)
    desc = {"input_shape": [2, 8, 8], "error_bits": 16, "rounding": {"forward": "rne", "backward": backward,
                                                                     "update": "pstoch"},
            "layers": [BN(2), {"type": "flatten"}, {"type": "linear", "in_features": 128, "out_features": 2}]}

    def load():
        m = Sequential.from_description(desc)
        m.layers[-1].weight.acc[:] = [[32512] * 128, [-32512] * 128]    # int8 views +-127: logits +-127 sum(x)
        return m

    rng = np.random.default_rng(0)
    n = 2048
    pos = rng.random(n) < 0.9                   # 90% positive offsets labelled 1: every prediction wrong at first
    x = (rng.integers(-60, 61, size=(n, 2, 8, 8)) + np.where(pos, 50, -50)[:, None, None, None]).astype(np.int8)
    r = run_check(load, x, -7, pos.astype(np.int64), 3, n, 12)
    assert r.ok, r.message
    assert r.changed > 0
    assert shifts[0][0] > 0 and shifts[0][1] > 0, shifts


@needs_cc
@pytest.mark.parametrize("error_bits", [8, 16])
def test_codegen_tensor_view_shifts_0_to_8(monkeypatch, error_bits):
    """weight_view "tensor": every int16 master tensor viewed at its own shift, computed from its codes at each
    forward. The initial codes are scaled so that the shifts span 0 (a gamma of codes < 128, the zero betas) to 8 (a
    convolution saturated at +-32767: its largest codes round to 128 and saturate to 127), with rne ties (s = 1);
    C and micro identical. The same C built with the fixed view (IT_WEIGHT_VIEW_TENSOR 0) differs at step 1, so the
    C really ran the tensors' shifts."""
    from inttrain.micro.layers import view_shift

    desc = {**TV(BN_RES), "error_bits": error_bits}
    # layers.0.weight x 8 (saturated), 1.gamma / 64, 1.beta, 3.block.0.weight / 32, 3.block.1.gamma, 3.block.1.beta,
    # 3.block.3.weight / 4, 7.weight
    prepare = _rescale([-3, 6, 0, 5, 0, 0, 2, 0])
    m = Sequential.from_description(desc)
    prepare(m)
    shifts = [view_shift(int(np.abs(p.acc).max()), 16, p.view) for _, p in m.named_params()]
    assert shifts == [8, 0, 0, 1, 6, 0, 4, 6]
    w0, w3 = m.named_params()[0][1].acc, m.named_params()[3][1].acc
    assert int(np.abs(w0).max()) == 32767 and int(np.sum(w3 % 2)) > 0     # views saturate; rne ties at s = 1
    r = _check(desc, mom=2, prepare=prepare)
    assert r.ok, r.message
    assert r.changed > 0
    real = check_mod.generate

    def fixed_view(*a, **kw):
        gen = real(*a, **kw)
        assert "#define IT_WEIGHT_VIEW_TENSOR 1\n" in gen.files["model_config.h"]
        gen.files["model_config.h"] = gen.files["model_config.h"].replace("VIEW_TENSOR 1", "VIEW_TENSOR 0")
        return gen

    monkeypatch.setattr(check_mod, "generate", fixed_view)
    r = _check(desc, mom=2, prepare=prepare)
    assert not r.ok and r.message.startswith("step 1: "), r.message


def test_codegen_weight_view_is_a_config_macro():
    """The view is chosen by model_config.h alone (IT_WEIGHT_VIEW_TENSOR 0 / 1; the description in model.h's comment
    says it): model.c is the same text, each linear / conv weight's shift taken in its forward (it_view_shift) and
    reused by its input-gradient GEMM, the view's exponent that shift above the master codes'."""
    fixed, tensor = (generate(Sequential.from_description(d), 4, 3).files for d in (BN_RES, TV(BN_RES)))
    assert "#define IT_WEIGHT_VIEW_TENSOR 0\n" in fixed["model_config.h"]
    assert "#define IT_WEIGHT_VIEW_TENSOR 1\n" in tensor["model_config.h"]
    assert '"weight_view": "tensor"' in tensor["model.h"] and "weight_view" not in fixed["model.h"]
    assert {k for k in fixed if fixed[k] != tensor[k]} == {"model_config.h", "model.h"}
    c = tensor["model.c"]
    assert "L3_b0_ws = it_view_shift(P3, 576u);" in c
    assert "it_conv_fwd(&L3_b0_cv, L1_y, L1_ye, P3, L3_b0_ws, -14 + L3_b0_ws, " in c
    assert re.search(r"it_conv_bwd_input\(&L3_b0_cv, \w+, \w+, P3, L3_b0_ws, -14 \+ L3_b0_ws, ", c)
    assert re.search(r"it_linear_bwd_input\(\w+, \w+, P7, L7_ws, -15 \+ L7_ws, ", c)
    assert "IT_W8_EXP_OFFSET" not in "".join(tensor.values())


def test_codegen_16bit_error_buffers_take_two_bytes():
    """error_bits 16: every error buffer (the loss error, the pool of error slots) is int16, 2 bytes an element,
    plus one int8 scratch for the GEMM operand; activations and the int32 scratch stay as they were."""
    m8, m16 = Sequential.from_description(MLP), Sequential.from_description(E16(MLP))
    g8, g16 = generate(m8, 4, 3), generate(m16, 4, 3)
    assert "#define IT_ERROR_BITS 8" in g8.files["model_config.h"]
    assert "#define IT_ERROR_BITS 16" in g16.files["model_config.h"]
    for g in (g8, g16):
        c = g.files["model.c"]
        assert "static it_ecode_t it_err[20];" in c and "static it_ecode_t it_g0[48];" in c
    assert "it_err8" not in g8.files["model.c"] and "static int8_t it_err8[48];" in g16.files["model.c"]
    assert "it_err_e = -7;" in g8.files["model.c"] and "it_err_e = -15;" in g16.files["model.c"]
    # errors 4x5 (loss) + 4x12 (one slot), now 2 bytes each, and the int8 operand scratch 4x12 (the largest output)
    assert g16.buffer_bytes - g8.buffer_bytes == (20 + 48) + 48
    # BN_WIDE: int16 convolution outputs and uint16 ranges count 2 bytes, int32 scratch 4
    w = generate(Sequential.from_description(BN_WIDE), 2, 3)
    sizes = {"int8_t": 1, "uint8_t": 1, "int16_t": 2, "uint16_t": 2, "it_ecode_t": 1}
    decl = re.findall(r"static (int8_t|uint8_t|int16_t|uint16_t|it_ecode_t|int32_t) (it_\w+|L\w+)\[(\d+)\];",
                      w.files["model.c"])
    assert w.buffer_bytes == sum(int(c) * sizes.get(t, 4) for t, _, c in decl)
    assert any(t == "int16_t" for t, _, _ in decl) and any(t == "uint16_t" for t, _, _ in decl)


def test_low_ram_drops_the_forward_accumulators():
    """LeNet-5 at batch 8: the int32 accumulator of the first convolution (8 x 6 x 28 x 28) is the largest buffer;
    --low-ram leaves only the backward's (the second convolution's input error, 8 x 6 x 14 x 14)."""
    lenet = {"input_shape": [1, 28, 28], "layers": [
        C(1, 6, k=5, p=2), R, {"type": "maxpool2d", "kernel_size": 2}, C(6, 16, k=5, p=0), R,
        {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"}, {"type": "linear", "in_features": 400, "out_features": 10}]}
    full = generate(Sequential.from_description(lenet), 8, 8)
    low = generate(Sequential.from_description(lenet), 8, 8, low_ram=True)
    assert "static int32_t it_acc[37632];" in full.files["model.c"]
    assert "static int32_t it_acc[9408];" in low.files["model.c"]
    assert full.buffer_bytes - low.buffer_bytes == 4 * (37632 - 9408)


def test_generated_code_is_freestanding():
    """No float, no malloc or stdio; only <stdint.h> and <string.h>; buffers are static arrays."""
    for desc in (BN_RES, E16(BN_RES)):
        files = generate(Sequential.from_description(desc), 4, 5, 2).files
        for name in ("model.c", "model.h", "inttrain_rt.c", "inttrain_rt.h", "model_config.h"):
            text = re.sub(r"/\*.*?\*/", "", files[name], flags=re.S)
            assert not re.search(r"\b(float|double|malloc|calloc|free|printf|FILE)\b", text), name
            assert set(re.findall(r"#include\s*<([^>]+)>", text)) <= {"stdint.h", "string.h"}, name
        assert "static int8_t L0_y[2048];" in files["model.c"]          # 4 samples x 8 x 8 x 8 codes, sized here
        assert '{"layers.3.block.0.weight", P3, 576u, ' in files["model.c"]


@needs_cc
def test_cli_codegen_check(tmp_path, capsys):
    x, y = _data((16,), n=50)
    np.savez(tmp_path / "d.npz", x=x, x_exp=np.int64(-7), y=y)
    (tmp_path / "m.json").write_text(json.dumps(MLP))
    rc = main(["codegen-check", str(tmp_path / "m.json"), str(tmp_path / "d.npz"), "--steps", "8", "--batch-size", "4",
               "--lr-shift", "3", "--keep", str(tmp_path / "src")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "codegen-check: OK: C and micro identical: every logit and weight code after each of 8 steps, 16 predictions" in out
    ram = int(re.search(r"static RAM: (\d+) bytes", out).group(1))
    # outputs 4x12 (the ReLU masks it in place) and 4x5, the loss error 4x5, one error slot 4x12 (the first
    # layer needs no input error; the ReLU masks in place), the int32 scratch 4x12; int16 master codes
    assert ram == (48 + 20 + 20 + 48 + 4 * 48) + 2 * (16 * 12 + 12 * 5)
    assert re.search(r"code size: \d+ bytes of code and constants \+ 504 bytes of initial codes", out)
    assert (tmp_path / "src" / "model.c").exists() and (tmp_path / "src" / "check_main.c").exists()


def test_cli_codegen_writes_sources(tmp_path, capsys):
    (tmp_path / "m.json").write_text(json.dumps(CNN))
    assert main(["codegen", str(tmp_path / "m.json"), "--out", str(tmp_path / "out"), "--batch-size", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "inttrain_rt.c", "inttrain_rt.h", "model.c", "model.h", "model_config.h"]
    assert "#define MODEL_BATCH 2 " in (tmp_path / "out" / "model.h").read_text()


@pytest.mark.parametrize("desc,args,message", [
    ({"input_shape": [16], "layers": [{"type": "dense", "units": 4}]}, [],
     "error: model description: layer 0: unknown layer type 'dense'"),
    ({"input_shape": [16], "layers": [{"type": "linear", "in_features": 8, "out_features": 4}]}, [],
     "error: model description: layer 0: linear expects input (8,), gets (16,)"),
    (MLP, ["--batch-size", "0"], "error: --batch-size 0: must be in [1, 65536]"),
    (MLP, ["--lr-shift", "63"], "error: --lr-shift 63: must be in [0, 62]"),
    (MLP, ["--momentum-shift", "17"], "error: --momentum-shift 17: must be in [1, 16]"),
])
def test_cli_codegen_refuses_bad_input(tmp_path, capsys, desc, args, message):
    (tmp_path / "m.json").write_text(json.dumps(desc))
    rc = main(["codegen", str(tmp_path / "m.json"), "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and err == message + "\n"
    assert not (tmp_path / "out").exists()                           # nothing half-written


def test_cli_codegen_check_refuses_bad_data(tmp_path, capsys):
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 15), np.int8), x_exp=np.int64(-7), y=np.zeros(4, np.int64))
    (tmp_path / "m.json").write_text(json.dumps(MLP))
    rc = main(["codegen-check", str(tmp_path / "m.json"), str(tmp_path / "d.npz"), "--steps", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("error: data: x has sample shape (15,), model wants (16,)")


@needs_cc
def test_docs_firmware_example_compiles_and_runs(tmp_path):
    """The C example of docs/codegen.md, built with the check's flags against a generated 8-input model."""
    import subprocess
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "codegen.md").read_text()
    example = re.search(r"```c\n(.*?)```", doc, re.S).group(1)
    desc = {"input_shape": [8], "layers": [{"type": "linear", "in_features": 8, "out_features": 6}, R,
                                           {"type": "linear", "in_features": 6, "out_features": 2}]}
    generate(Sequential.from_description(desc), 4, 4).write(tmp_path)
    (tmp_path / "main.c").write_text(example)
    exe = tmp_path / "fw"
    subprocess.run([find_cc(), *check_mod.CFLAGS, "-o", str(exe), *(str(tmp_path / f) for f in
                                                                     ("main.c", "model.c", "inttrain_rt.c"))], check=True)
    assert subprocess.run([str(exe)]).returncode == 0


@needs_cc
def test_cli_codegen_check_from_saved_model(tmp_path, capsys):
    """A saved (trained) model directory generates C that starts from its codes; a corrupted one is refused."""
    from inttrain.micro import SGD, train_epoch
    from inttrain.micro.model import save_model

    x, y = _data((1, 8, 8), n=24)
    model = Sequential.from_description(BN_RES)
    train_epoch(model, SGD(model.params(), 3), x, -7, y, 8)
    save_model(model, tmp_path / "run")
    np.savez(tmp_path / "d.npz", x=x, x_exp=np.int64(-7), y=y)
    rc = main(["codegen-check", str(tmp_path / "run"), str(tmp_path / "d.npz"), "--steps", "3", "--batch-size", "8",
               "--lr-shift", "3", "--keep", str(tmp_path / "src")])
    assert rc == 0 and "codegen-check: OK" in capsys.readouterr().out
    w = model.named_params()[0][1].acc
    assert ", ".join(str(int(v)) for v in w.reshape(-1)[:8]) in (tmp_path / "src" / "model.c").read_text()
    doc = json.loads((tmp_path / "run" / "model.json").read_text())
    doc["params"]["layers.0.weight"]["bits"] = 8
    (tmp_path / "run" / "model.json").write_text(json.dumps(doc))
    assert main(["codegen", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "layers.0.weight: bits 8 != weight_bits 16" in err


def test_codegen_imports_no_torch():
    """The generator is part of the device engine: importing it (and its CLI) must not pull in torch."""
    import subprocess
    import sys

    code = "import sys, inttrain.micro.codegen, inttrain.micro.__main__; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _random_description(rng) -> dict:
    """A small random network: linear or conv (kernel 1-3, stride 1-2, padding 0-1), optional batch norm and
    residual, max or average pool (window 1-3), optional global pool; random rounding modes and weight bits."""
    modes = list(ROUNDING_MODES)
    rounding = {k: str(rng.choice(modes)) for k in ("forward", "backward", "update")}
    out = {"type": "linear", "in_features": 0, "out_features": int(rng.integers(2, 6))}
    if rng.random() < 0.4:
        d0, h = int(rng.integers(3, 20)), int(rng.integers(3, 12))
        layers = [{"type": "linear", "in_features": d0, "out_features": h}, *([BN(h)] if rng.random() < 0.5 else []), R]
        if rng.random() < 0.5:
            layers.append({"type": "residual", "layers": [{"type": "linear", "in_features": h, "out_features": h}]})
        shape, out["in_features"] = [d0], h
    else:
        c, hw, o = int(rng.integers(1, 3)), int(rng.integers(5, 11)), int(rng.integers(2, 5))
        k, s, p = int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.integers(0, 2))
        oh = (hw + 2 * p - k) // s + 1
        layers = [C(c, o, k, s, p), *([BN(o)] if rng.random() < 0.5 else []), R]
        if rng.random() < 0.5:
            layers.append({"type": "residual", "layers": [C(o, o), R]})
        pk = int(rng.integers(1, 4))
        if oh >= pk:
            layers.append({"type": str(rng.choice(["maxpool2d", "avgpool2d"])), "kernel_size": pk})
            oh //= pk
        if rng.random() < 0.3:
            layers.append({"type": "globalavgpool2d"})
            oh = 1
        layers.append({"type": "flatten"})
        shape, out["in_features"] = [c, hw, hw], o * oh * oh
    return {"input_shape": shape, "weight_bits": int(rng.choice([8, 16])), "rounding": rounding, "layers": [*layers, out]}


def _random_network_check(trial: int, error_bits: int, tensor_view: bool = False) -> None:
    rng = np.random.default_rng(1000 + trial)
    desc = _random_description(rng)
    if error_bits == 16:
        desc["error_bits"] = 16
    prepare = None
    if tensor_view:                 # int16 masters (int8 ones have no shift), their codes scaled: shifts 0..8
        desc.update(weight_bits=16, weight_view="tensor")
        prepare = _rescale([int(k) for k in np.random.default_rng(2000 + trial).integers(-2, 8, 64)])
    n, batch = int(rng.integers(3, 25)), int(rng.integers(1, 9))
    x = rng.integers(-127, 128, size=(n, *desc["input_shape"])).astype(np.int8)
    if rng.random() < 0.3:
        x[:] = x[:1]
    y = rng.integers(0, desc["layers"][-1]["out_features"], n)
    mom = int(rng.integers(1, 5)) if rng.random() < 0.3 else None
    r = _check(desc, steps=int(rng.integers(1, 8)), batch=batch, lr=int(rng.integers(0, 12)), mom=mom,
               x_exp=int(rng.integers(-10, 4)), data=(x, y), low_ram=bool(rng.random() < 0.5), prepare=prepare)
    assert r.ok, (r.message, desc)


@needs_cc
@pytest.mark.slow
@pytest.mark.parametrize("error_bits", [8, 16])
@pytest.mark.parametrize("trial", range(40))
def test_codegen_bit_exact_random_networks(trial, error_bits):
    """Random small networks, data (sometimes one repeated sample), exponents, batch sizes, learning rates
    (2**0: saturating updates) and momentum, with and without --low-ram, with 8- and 16-bit errors between
    layers (the same network, data and settings for both): C and micro identical."""
    _random_network_check(trial, error_bits)


@needs_cc
@pytest.mark.slow
@pytest.mark.parametrize("trial,error_bits", [(0, 8), (1, 16), (2, 8), (3, 16), (4, 8), (5, 16)])
def test_codegen_bit_exact_random_networks_tensor_view(trial, error_bits):
    """The same random networks with int16 masters viewed each at its own shift (weight_view "tensor"), their
    initial codes scaled by random powers of two (up to saturation at +-32767): C and micro identical."""
    _random_network_check(trial, error_bits, tensor_view=True)
