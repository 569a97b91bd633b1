"""Integer layers under ``torch.autocast``: bfloat16 activations in and out, the same integer GEMMs.

The codes a quantizer makes from a bfloat16 tensor are those of its float32 upcast, so every result here is
the float32 path's, rounded to bfloat16 where the layer hands it on."""

from __future__ import annotations

import torch

from inttrain.autograd import int_linear
from inttrain.autograd.conv import ConvGeometry, int_conv2d
from inttrain.recipes import Int8MixedConfig

BF16, CL = torch.bfloat16, torch.channels_last
GEOM = ConvGeometry((1, 1), (1, 1), (1, 1), 1)


def _conv_case(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 16, 6, 6, generator=g).contiguous(memory_format=CL)
    w = torch.randn(8, 16, 3, 3, generator=g) * 0.1
    dy = torch.randn(2, 8, 6, 6, generator=g).contiguous(memory_format=CL)
    return x, w, dy, Int8MixedConfig().precision_for(torch.nn.Conv2d(16, 8, 3), "conv")


def _conv_grads(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, prec, autocast: bool):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        y = int_conv2d(x, w, None, GEOM, prec, (1, 2, 3))
    y.backward(dy.to(y.dtype))
    return y, x.grad, w.grad


def test_conv_under_autocast_hands_on_bfloat16_of_the_float32_result() -> None:
    x, w, dy, prec = _conv_case(0)
    y32, _, _ = _conv_grads(x, w, dy, prec, autocast=False)
    y, dx, dw = _conv_grads(x, w, dy, prec, autocast=True)
    assert y.dtype == BF16 and torch.equal(y, y32.to(BF16))
    assert dx.dtype == torch.float32 and dw.dtype == torch.float32  # the input's and the weight's dtypes


def test_conv_on_bfloat16_activations_equals_the_float32_path_on_their_upcast() -> None:
    x, w, dy, prec = _conv_case(1)
    xb, dyb = x.to(BF16), dy.to(BF16)
    y, dx, dw = _conv_grads(xb, w, dyb, prec, autocast=False)
    y32, dx32, dw32 = _conv_grads(xb.float(), w, dyb.float(), prec, autocast=False)
    assert y.dtype == BF16 and torch.equal(y, y32.to(BF16))
    assert dx.dtype == BF16 and torch.equal(dx, dx32.to(BF16))
    assert torch.equal(dw, dw32)


def test_linear_under_autocast_and_on_bfloat16() -> None:
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(64, 32, generator=g), torch.randn(16, 32, generator=g) * 0.1
    dy = torch.randn(64, 16, generator=g)
    prec = Int8MixedConfig().precision_for(torch.nn.Linear(32, 16), "fc")

    def run(xin: torch.Tensor, dyin: torch.Tensor, autocast: bool):
        xin, wt = xin.detach().requires_grad_(), w.detach().requires_grad_()
        with torch.autocast("cpu", dtype=BF16, enabled=autocast):
            y = int_linear(xin, wt, None, prec, (4, 5, 6))
        y.backward(dyin.to(y.dtype))
        return y, xin.grad, wt.grad

    y32, dx32, dw32 = run(x, dy, False)
    y, dx, _ = run(x, dy, True)
    assert y.dtype == BF16 and torch.equal(y, y32.to(BF16)) and dx.dtype == torch.float32
    xb, dyb = x.to(BF16), dy.to(BF16)
    yb, dxb, dwb = run(xb, dyb, False)
    yu, dxu, dwu = run(xb.float(), dyb.float(), False)
    assert yb.dtype == BF16 and torch.equal(yb, yu.to(BF16))
    assert dxb.dtype == BF16 and torch.equal(dxb, dxu.to(BF16)) and torch.equal(dwb, dwu)


def test_recipe_autocast_and_a_prepared_model() -> None:
    import inttrain

    cfg = Int8MixedConfig(bf16_activations=True)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 5 * 5, 3))
    inttrain.prepare_(model, cfg)
    x = torch.randn(2, 4, 5, 5).contiguous(memory_format=CL)
    with cfg.autocast("cpu"):
        hidden = model[2](model[1](model[0](x)))
        out = model(x)
    assert hidden.dtype == BF16 and out.dtype == BF16
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    with Int8MixedConfig().autocast("cpu"):
        assert model(x).dtype == torch.float32
