"""Range BN (Banner et al. 2018, Eq. 4-5): a drop-in BatchNorm2d normalising by C(n) * range."""

import math

import pytest
import torch
from torch import nn

from inttrain.nn.range_bn import SPREAD_FACTOR, RangeBatchNorm2d, range_scale, use_range_bn_

TOLERANCE = 0.20  # C(m) * range estimates sigma to within ~10 % for m in 1e2..1e5 values per chunk (Gaussian)


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
    x = torch.tensor([0.0, 1.0, 2.0, 5.0]).view(1, 1, 2, 2)  # mean 2; one sample: one chunk, spread 5
    mean, scale = range_scale(x)
    assert float(mean) == 2.0
    assert float(scale) == pytest.approx(5 * SPREAD_FACTOR / math.sqrt(2 * math.log(4)))
    assert SPREAD_FACTOR == pytest.approx(0.540, abs=5e-4)  # the reference code's 0.35 (1 + sqrt(pi ln 4)) / 2


def test_range_is_the_mean_spread_of_chunks_of_whole_samples():
    """Batch 4, 2 chunks (gcd(4, 2)): samples {0, 1} and {2, 3}, spreads 3 and 9 -> range 6 over m = 2 * 2 values;
    batch 6 with 4 chunks asked -> gcd 2 chunks; a batch of 3 single values with 3 chunks asked -> 1 chunk."""
    x = torch.tensor([0.0, 1.0, 3.0, 2.0, 10.0, 1.0, 4.0, 7.0]).view(4, 1, 1, 2)
    mean, scale = range_scale(x, num_chunks=2)
    assert float(mean) == pytest.approx(28 / 8)
    assert float(scale) == pytest.approx(6 * SPREAD_FACTOR / math.sqrt(2 * math.log(4)))
    six = torch.arange(12.0).view(6, 1, 1, 2)  # chunks {0, 1, 2} and {3, 4, 5}: spreads 5 and 5, m = 6
    assert float(range_scale(six, num_chunks=4)[1]) == pytest.approx(5 * SPREAD_FACTOR / math.sqrt(2 * math.log(6)))
    three = torch.tensor([0.0, 4.0, 1.0]).view(3, 1, 1, 1)
    assert float(range_scale(three, num_chunks=3)[1]) == pytest.approx(4 * SPREAD_FACTOR / math.sqrt(2 * math.log(3)))
    with pytest.raises(ValueError, match="num_chunks must be a positive integer, got 0"):
        range_scale(x, num_chunks=0)


@pytest.mark.parametrize("chunks", [1, 16])
def test_scale_gradient_reaches_two_values_per_chunk(chunks):
    """The backward of the range reaches each chunk's max and min only: 2 * chunks values per channel, each
    carrying 1 / chunks of the whole -- why the reference implementation's 16 chunks tame the spike."""
    torch.manual_seed(0)
    x = torch.randn(32, 2, 4, 4, requires_grad=True)
    _, scale = range_scale(x, num_chunks=chunks)
    scale.sum().backward()
    per_channel = (x.grad != 0).sum((0, 2, 3))
    assert per_channel.tolist() == [2 * chunks, 2 * chunks]
    largest = x.grad.abs().amax().item()
    assert largest == pytest.approx(SPREAD_FACTOR / math.sqrt(2 * math.log(32 * 16 // chunks)) / chunks, rel=1e-5)


def test_module_num_chunks_is_an_instance_override():
    torch.manual_seed(0)
    x = torch.randn(16, 3, 4, 4)
    rbn = RangeBatchNorm2d(3)
    assert rbn.num_chunks == 16
    y16 = rbn(x)
    rbn.num_chunks = 1
    mean, scale = range_scale(x, num_chunks=1)
    ref = (x - mean.view(1, -1, 1, 1)) / torch.sqrt(scale * scale + rbn.eps).view(1, -1, 1, 1)
    torch.testing.assert_close(rbn(x), ref * rbn.weight.view(1, -1, 1, 1) + rbn.bias.view(1, -1, 1, 1))
    assert not torch.allclose(rbn(x), y16)


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
