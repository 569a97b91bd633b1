"""inttrain.recipes.integer_only: config, conversion of a float nn.Sequential to the integer-only engine."""

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from inttrain import integer_only as T
from inttrain import micro as M
from inttrain.recipes.integer_only import IntegerOnlyConfig, convert, float_to_codes, optimizer


def test_config_frozen_and_validated():
    c = IntegerOnlyConfig()
    assert (c.lr_mode, c.lr_bits, c.lr_shift, c.weight_bits, c.momentum_shift) == ("norm", 10, 8, 16, None)
    assert c.adapt_exp and c.decay_shift is None
    assert c.rounding == {"forward": "rne", "backward": "hstoch", "update": "pstoch"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.lr_shift = 3
    for bad in ({"weight_bits": 12}, {"lr_shift": 63}, {"momentum_shift": 0}, {"update_rounding": "up"},
                {"lr_mode": "adam"}, {"lr_bits": 15}, {"decay_shift": 0}, {"bn_gain_shift": -1},
                {"bn_gain_shift": 9}, {"bn_gain_shift": True}, {"bn_input_bits": 12}, {"bn_input_bits": True},
                {"error_bits": 12}, {"error_bits": True}):
        with pytest.raises(ValueError):
            IntegerOnlyConfig(**bad)


def test_float_to_codes():
    w = np.array([[0.5, -0.25], [0.1, 0.0]])
    codes, e = float_to_codes(w, 16)
    assert e == -13 and codes.tolist() == [[4096, -2048], [819, 0]]          # 0.5 -> 4096 <= 32767 // 4
    codes8, e8 = float_to_codes(w, 8)
    assert e8 == -5 and codes8.tolist() == [[16, -8], [3, 0]]
    assert float_to_codes(np.zeros(3), 8)[0].tolist() == [0, 0, 0]


def test_convert_mlp_copies_weights_and_checks_modules():
    torch.manual_seed(0)
    f = nn.Sequential(nn.Linear(64, 32, bias=False), nn.ReLU(), nn.Linear(32, 10, bias=False))
    cfg = IntegerOnlyConfig(weight_bits=8, momentum_shift=2, lr_shift=7, lr_mode="shift")
    m = convert(f, cfg)
    assert isinstance(m, T.Sequential) and m.desc["input_shape"] == [64] and m.desc["weight_bits"] == 8
    for (_, p), lin in zip(m.named_params(), (f[0], f[2])):
        w = lin.weight.detach().double()
        assert p.acc.dtype == torch.int8
        assert (p.acc.double() * 2.0 ** p.exp - w).abs().max() <= 2.0 ** p.exp / 2 + 1e-12
    opt = optimizer(m, cfg)
    assert (opt.lr_shift, opt.momentum_shift, opt.rounding) == (7, 2, "pstoch")
    with pytest.raises(ValueError, match="bias"):
        convert(nn.Sequential(nn.Linear(4, 2)))
    assert convert(nn.Sequential(nn.Linear(4, 2)), IntegerOnlyConfig(drop_bias=True)).desc["num_classes"] == 2
    for bad in (nn.Sequential(nn.Linear(4, 4, bias=False), nn.Sigmoid()),
                nn.Sequential(nn.Conv2d(1, 2, 3, groups=1, dilation=2, bias=False), nn.Flatten(), nn.Linear(8, 2, bias=False)),
                nn.Sequential(nn.Conv2d(1, 2, 3, bias=False), nn.MaxPool2d(2, stride=1), nn.Flatten())):
        with pytest.raises(ValueError):
            convert(bad, input_shape=[1, 8, 8])
    with pytest.raises(ValueError, match="input_shape"):
        convert(nn.Sequential(nn.Conv2d(1, 2, 3, bias=False), nn.Flatten()))


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.minimum(d.data * 8, 127).astype(np.int8).reshape(-1, 1, 8, 8)
    perm = np.random.default_rng(0).permutation(len(x))
    tr, te = perm[:1437], perm[1437:]
    return x[tr], x[te], d.target[tr], d.target[te]


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(128, 10, bias=False))


def test_converted_cnn_matches_float_forward_and_trains(digits, tmp_path):
    """Measured: 0.928 test accuracy after 2 epochs (lr 2**-6, batch 32) from torch's default init (seed 0)."""
    xtr, xte, ytr, yte = digits
    f = _cnn()
    m = convert(f, IntegerOnlyConfig(lr_shift=6, lr_mode="shift"), input_shape=[1, 8, 8])
    xb = torch.from_numpy(xtr[:64])
    logits = m.forward(T.IntTensor(xb, -7)).to_float()
    with torch.no_grad():
        ref = f(xb.float() * 2.0 ** -7).double()
    cos = float((logits * ref).sum() / logits.norm() / ref.norm())
    assert cos > 0.99, cos                                           # the integer forward is the float one
    opt = optimizer(m, IntegerOnlyConfig(lr_shift=6, lr_mode="shift"))
    for ep in range(2):
        T.train_epoch(m, opt, xtr, -7, ytr, 32, seed=ep)
    acc = T.evaluate(m, xte, -7, yte)
    print("converted cnn test accuracy", acc)
    assert acc > 0.9, acc
    m.save(tmp_path / "run")                                        # micro's format
    mm = M.load_model(tmp_path / "run")
    assert M.evaluate(mm, xte, -7, yte) == acc


def test_convert_resnet_builds_residual_blocks_from_the_float_model():
    """A CIFAR ResNet (BasicBlocks, 1x1 projection shortcuts, global pooling) converts through as_sequential()
    and residual_parts(): same layer structure, every conv's codes from its float weights, the float forward."""
    from inttrain.models.resnet import CifarResNet

    torch.manual_seed(0)
    f = CifarResNet(8, 10, 3)
    with pytest.raises(ValueError, match="bias"):
        convert(f, input_shape=[3, 16, 16])
    m = convert(f, IntegerOnlyConfig(drop_bias=True), input_shape=[3, 16, 16])
    kinds = [s["type"] for s in m.desc["layers"]]
    assert kinds == ["conv2d", "batchnorm", "relu"] + ["residual", "relu"] * 3 + ["globalavgpool2d", "flatten", "linear"]
    blocks = [s for s in m.desc["layers"] if s["type"] == "residual"]
    assert [len(b["shortcut"]) for b in blocks] == [0, 2, 2]                   # identity, then conv 1x1 + BN
    assert blocks[1]["shortcut"][0] == {"type": "conv2d", "in_channels": 16, "out_channels": 32, "kernel_size": 1,
                                        "stride": 2, "padding": 0}
    assert blocks[1]["layers"][0]["stride"] == 2
    floats = [mod.weight for mod in f.modules() if isinstance(mod, (nn.Conv2d, nn.Linear))]
    convs = [p for n, p in m.named_params() if n.endswith("weight")]
    # named_params order: stem, then per block its body and shortcut, then the classifier (the module order)
    assert len(convs) == len(floats)
    for p, w in zip(convs, floats):
        codes, exp = float_to_codes(w.detach().double().numpy(), 16)
        assert p.exp == exp and np.array_equal(p.acc.numpy(), codes)
    x = torch.randn(8, 3, 16, 16).clamp(-3.9, 3.9)
    q = torch.round(x * 32).to(torch.int8)
    logits = m.forward(T.IntTensor(q, -5)).to_float()
    with torch.no_grad():
        ref = f.train()(q.float() / 32).double()                 # batch statistics, as the integer batch norm
    cos = float((logits * ref).sum() / logits.norm() / ref.norm())
    assert cos > 0.95, cos  # measured 0.969 (0.965-0.978 over seeds 0-2)
    trained = CifarResNet(8, 10, 3)
    nn.init.constant_(trained.bn1.weight, 0.5)
    with pytest.raises(ValueError, match=r"layer 1 \(BatchNorm2d\): only an untrained batch norm"):
        convert(trained, IntegerOnlyConfig(drop_bias=True), input_shape=[3, 16, 16])


def test_bn_gain_shift_brings_the_converted_resnet_to_float_batch_norm_scale():
    """bn_gain_shift=3 writes ``gain_shift`` into every batch norm (residual blocks and shortcuts included) and
    scales the logits by ~8 (the range batch norm's outputs are ~1/9 of float batch norm's), same direction."""
    from inttrain.models.resnet import CifarResNet

    torch.manual_seed(0)
    f = CifarResNet(8, 10, 3)
    x = torch.randn(8, 3, 16, 16).clamp(-3.9, 3.9)
    q = torch.round(x * 32).to(torch.int8)
    with torch.no_grad():
        ref = f.train()(q.float() / 32).double()
    ratio, gains = {}, {}
    for shift in (0, 3):
        m = convert(f, IntegerOnlyConfig(drop_bias=True, bn_gain_shift=shift), input_shape=[3, 16, 16])
        gains[shift] = {layer.gain_shift for layer in _flat_layers(m.layers) if isinstance(layer, T.BatchNorm)}
        logits = m.forward(T.IntTensor(q, -5)).to_float()
        ratio[shift] = float(logits.norm() / ref.norm())
        assert float((logits * ref).sum() / logits.norm() / ref.norm()) > 0.95
    assert gains == {0: {0}, 3: {3}}
    default = convert(f, IntegerOnlyConfig(drop_bias=True), input_shape=[3, 16, 16])  # the gain is the default
    assert {layer.gain_shift for layer in _flat_layers(default.layers) if isinstance(layer, T.BatchNorm)} == {3}
    assert 0.1 < ratio[0] < 0.25 and 1.0 < ratio[3] < 1.8, ratio   # measured 0.163-0.174 and 1.30-1.39, seeds 0-2


def test_bn_input_bits_16_widens_every_convolution_that_feeds_a_batch_norm():
    """bn_input_bits=16 gives ``out_bits`` 16 to each convolution followed by a batch norm (blocks and projection
    shortcuts), and to nothing else; the logits stay close to the 8-bit conversion's."""
    from inttrain.models.resnet import CifarResNet

    torch.manual_seed(0)
    f = CifarResNet(8, 10, 3)
    q = torch.round(torch.randn(8, 3, 16, 16).clamp(-3.9, 3.9) * 32).to(torch.int8)
    logits = {}
    for bits in (8, 16):
        m = convert(f, IntegerOnlyConfig(drop_bias=True, bn_input_bits=bits), input_shape=[3, 16, 16])
        convs = [layer for layer in _flat_layers(m.layers) if isinstance(layer, T.Conv2d)]
        assert {c.out_bits for c in convs} == {bits} and len(convs) == 9          # each conv feeds a batch norm
        logits[bits] = m.forward(T.IntTensor(q, -5)).to_float()
    cos = float((logits[8] * logits[16]).sum() / logits[8].norm() / logits[16].norm())
    assert cos > 0.95, cos


def test_error_bits_16_is_written_into_the_description_and_every_layer():
    from inttrain.models.resnet import CifarResNet

    torch.manual_seed(0)
    for bits in (8, 16):
        m = convert(CifarResNet(8, 10, 3), IntegerOnlyConfig(drop_bias=True, error_bits=bits), input_shape=[3, 16, 16])
        assert m.desc.get("error_bits", 8) == bits and m.err_bits == bits
        assert {layer.err_bits for layer in _flat_layers(m.layers)} == {bits}


def test_weight_view_tensor_is_written_into_the_description_and_survives_save_and_load(tmp_path):
    from inttrain.models.resnet import CifarResNet

    torch.manual_seed(0)
    m = convert(CifarResNet(8, 10, 3), IntegerOnlyConfig(drop_bias=True, weight_view="tensor"), input_shape=[3, 16, 16])
    assert m.desc["weight_view"] == "tensor" and {p.view for p in m.params()} == {"tensor"}
    m.save(tmp_path / "m")
    loaded = M.load_model(tmp_path / "m")
    assert loaded.desc["weight_view"] == "tensor" and {p.view for p in loaded.params()} == {"tensor"}
    assert "weight_view" not in convert(CifarResNet(8, 10, 3), IntegerOnlyConfig(drop_bias=True),
                                        input_shape=[3, 16, 16]).desc
    with pytest.raises(ValueError, match="integer-only weight_view='channel': allowed 'fixed' or 'tensor'"):
        IntegerOnlyConfig(weight_view="channel")


def test_frac_bits_reaches_the_optimizer_and_is_range_checked():
    from inttrain.models.resnet import CifarResNet
    from inttrain.recipes.integer_only import optimizer

    m = convert(CifarResNet(8, 10, 3), IntegerOnlyConfig(drop_bias=True), input_shape=[3, 16, 16])
    assert optimizer(m, IntegerOnlyConfig(frac_bits=12)).frac_bits == 12
    assert optimizer(m, IntegerOnlyConfig()).frac_bits is None
    for bad in (0, 16, True):
        with pytest.raises(ValueError, match=rf"integer-only frac_bits={bad!r}: allowed None or 1\.\.15"):
            IntegerOnlyConfig(frac_bits=bad)


def test_nesterov_reaches_the_optimizer_and_needs_momentum():
    from inttrain.models.resnet import CifarResNet
    from inttrain.recipes.integer_only import optimizer

    m = convert(CifarResNet(8, 10, 3), IntegerOnlyConfig(drop_bias=True), input_shape=[3, 16, 16])
    assert optimizer(m, IntegerOnlyConfig(momentum_shift=3, nesterov=True)).nesterov is True
    assert optimizer(m, IntegerOnlyConfig(momentum_shift=3)).nesterov is False
    for bad in ({"nesterov": True}, {"nesterov": 1, "momentum_shift": 3}):
        with pytest.raises(ValueError, match=rf"integer-only nesterov={bad['nesterov']!r}: allowed False, or True "
                                             "with a momentum_shift"):
            IntegerOnlyConfig(**bad)


def _flat_layers(layers):
    for layer in layers:
        yield layer
        if isinstance(layer, T.Residual):
            yield from _flat_layers(layer.block + layer.shortcut)
