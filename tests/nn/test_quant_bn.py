"""QuantBatchNorm2d (WAGEUBN's 8-bit BN) and the power-of-two quantizer against their definitions."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from inttrain.nn.quant_bn import QuantBatchNorm2d, pow2_fake_quant, pow2_quantize, use_quant_bn_


def _is_pow2(s: torch.Tensor) -> bool:
    e = math.log2(float(s))
    return e == round(e)


def test_pow2_quantize_hand_made():
    codes, scale = pow2_quantize(torch.tensor([0.5, -1.0, 0.25]), 8)
    # 1 / 127 = 2^-6.99 -> 2^-6
    assert float(scale) == 2.0**-6
    assert codes.tolist() == [32.0, -64.0, 16.0]
    codes, scale = pow2_quantize(torch.tensor([3.0, -0.1]), 4)  # 3 / 7 -> 2^-1; codes 6, round(-0.2) = 0
    assert float(scale) == 0.5 and codes.tolist() == [6.0, -0.0]
    codes, scale = pow2_quantize(torch.zeros(5), 8)
    assert float(scale) == 1.0 and codes.abs().sum() == 0


def test_pow2_quantize_random_is_on_the_grid():
    torch.manual_seed(0)
    for bits in (8, 16, 24):
        x = torch.randn(1000) * 3.7
        codes, scale = pow2_quantize(x, bits)
        qmax = 2 ** (bits - 1) - 1
        assert _is_pow2(scale) and codes.abs().max() <= qmax and torch.equal(codes, codes.round())
        assert codes.abs().max() > qmax // 2  # pow2 scale costs at most one bit
        assert float((codes * scale - x).abs().max()) <= float(scale) / 2
    sr, _ = pow2_quantize(x, 8, stochastic=True, seed=3)
    assert torch.equal(sr, pow2_quantize(x, 8, stochastic=True, seed=3)[0])  # reproducible


def _reference(bn: QuantBatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    q = lambda t: torch.mul(*pow2_quantize(t, 8))  # noqa: E731
    x_hat = F.batch_norm(x, None, None, training=True, eps=bn.eps)
    y = q(x_hat) * q(bn.weight).view(1, -1, 1, 1) + q(bn.bias).view(1, -1, 1, 1)
    return q(y)


def test_quant_bn_matches_definition_and_is_8bit():
    torch.manual_seed(0)
    bn = QuantBatchNorm2d(4)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.5, 1.3, -0.7, 2.0]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.0, 0.33]))
    x = torch.randn(8, 4, 5, 5) * 3 + 1
    y = bn(x).detach()
    torch.testing.assert_close(y, _reference(bn, x), rtol=0, atol=1e-6)
    levels = torch.unique(y)
    assert len(levels) <= 255
    step = (levels[1:] - levels[:-1]).min()
    assert _is_pow2(step) and torch.allclose(levels / step, (levels / step).round())
    # running statistics as nn.BatchNorm2d
    ref = nn.BatchNorm2d(4)
    ref(x)
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)


def test_quant_bn_backward_and_eval_and_swap():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3))
    keys = list(model.state_dict())
    use_quant_bn_(model)
    assert type(model[1]) is QuantBatchNorm2d and list(model.state_dict()) == keys
    x = torch.randn(4, 1, 6, 6, requires_grad=True)
    model(x).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0 and model[1].weight.grad.abs().sum() > 0
    model.eval()
    y = model(x).detach()
    assert len(torch.unique(y)) <= 255
    t = torch.tensor([0.3, -2.0], requires_grad=True)
    pow2_fake_quant(t).sum().backward()
    assert t.grad.tolist() == [1.0, 1.0]  # straight-through
