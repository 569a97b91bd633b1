"""Range BN (Banner et al. 2018, Eq. 4-5): a drop-in BatchNorm2d normalising by C(n) * range."""

import math

import pytest
import torch
from torch import nn

from inttrain.nn.range_bn import RangeBatchNorm2d, range_scale, use_range_bn_

TOLERANCE = 0.20  # C(n) * half-range estimates sigma to within 10-15 % for n in 1e3..1e5 (Gaussian)


@pytest.mark.parametrize("shape", [(32, 4, 8, 8), (64, 3, 16, 16), (16, 2, 32, 32)])
def test_matches_batchnorm_on_gaussian_batches(shape):
    torch.manual_seed(0)
    c = shape[1]
    x = torch.randn(shape) * torch.linspace(0.5, 3.0, c).view(1, -1, 1, 1) + torch.linspace(-2, 2, c).view(1, -1, 1, 1)
    bn, rbn = nn.BatchNorm2d(c), RangeBatchNorm2d(c)
    with torch.no_grad():
        y_bn, y_r = bn(x), rbn(x)
    rel = (y_r - y_bn).abs() / y_bn.abs().clamp_min(1e-3)
    assert float(rel.median()) < TOLERANCE and float(rel.max()) < TOLERANCE + 0.02
    torch.testing.assert_close(rbn.running_mean, bn.running_mean)
    assert torch.allclose(rbn.running_var.sqrt(), bn.running_var.sqrt(), rtol=TOLERANCE)


def test_range_scale_is_the_papers_formula():
    x = torch.tensor([0.0, 1.0, 2.0, 5.0]).view(1, 1, 2, 2)  # mean 2; x - mu in [-2, 3]; spread 5
    mean, scale = range_scale(x)
    assert float(mean) == 2.0
    assert float(scale) == pytest.approx(5 / 2 / math.sqrt(2 * math.log(4)))


def test_eval_uses_running_stats_and_backward_flows():
    torch.manual_seed(0)
    rbn = RangeBatchNorm2d(3)
    x = torch.randn(8, 3, 4, 4, requires_grad=True)
    rbn(x).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and rbn.weight.grad is not None
    rbn.eval()
    y = rbn(x.detach())
    ref = (x.detach() - rbn.running_mean.view(1, -1, 1, 1)) / torch.sqrt(rbn.running_var.view(1, -1, 1, 1) + rbn.eps)
    torch.testing.assert_close(y, ref * rbn.weight.view(1, -1, 1, 1) + rbn.bias.view(1, -1, 1, 1))


def test_drop_in_swap_keeps_state_dict():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    keys = list(model.state_dict())
    use_range_bn_(model)
    assert type(model[1]) is RangeBatchNorm2d and list(model.state_dict()) == keys
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        model(torch.randn(1, 1, 3, 3))
