"""Per-sample DFQ (issue 19): each sample's gate picks its own bits; the layer runs one integer call per width
present, and every sample's output carries the error of its own width."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import inttrain
from inttrain.recipes import Int8MixedConfig
from inttrain.cost import BitOpsCounter
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.numerics.metrics import sqnr_db
from inttrain.recipes.fractrain_dfq import DFQConfig, attach_dfq
from inttrain.schedules import Constant, PrecisionScheduler


def _force_by_sign(layer: nn.Module) -> None:
    """Gate over (4, 8) that picks 4 bits where the pooled channel 0 is positive, 8 where it is negative
    (logit gap 2 x 30 x |feature| > the Gumbel noise's range of ~19 for the features used below)."""
    with torch.no_grad():
        fc = layer.dfq_gate.fc
        fc.weight.zero_()
        fc.bias.zero_()
        fc.weight[0, 0], fc.weight[1, 0] = 30.0, -30.0


def _inputs_linear() -> torch.Tensor:
    torch.manual_seed(3)
    x = torch.randn(12, 64)
    x[:, 0] = torch.tensor([1.0, -1.0] * 6)  # samples 0, 2, 4, ... -> 4-bit; 1, 3, 5, ... -> 8-bit
    return x


def _inputs_conv() -> torch.Tensor:
    torch.manual_seed(4)
    x = torch.randn(10, 3, 8, 8)
    x[:, 0] = torch.tensor([1.0, -1.0] * 5).reshape(-1, 1, 1)
    return x


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_forced_gate_gives_each_sample_its_own_width(kind: str) -> None:
    """One eval pass: even samples run at 4 bits, odd ones at 8 (two integer calls, one per width); every
    sample's output equals the layer run at its width on its group alone, bit for bit; the 4-bit samples are
    measurably noisier against the float layer (SQNR >= 15 dB lower than the 8-bit samples)."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 48) if kind == "linear" else nn.Conv2d(3, 16, 3, padding=1)
    ref = copy.deepcopy(layer)
    m = nn.Sequential(layer)
    inttrain.prepare_(m, "int8")
    fixed = {b: copy.deepcopy(m) for b in (4, 8)}
    for b, f in fixed.items():
        PrecisionScheduler(f, Constant(b, 8))
    dfq = attach_dfq(m, DFQConfig(bits=(4, 8), target_cost=0.5))
    _force_by_sign(m[0])
    x = _inputs_linear() if kind == "linear" else _inputs_conv()
    m.eval()
    reset_kernel_calls()
    with torch.no_grad():
        y = m(x)
    calls = int_kernel_calls()
    assert calls.get("int8_mm" if kind == "linear" else "conv_fwd", 0) == 2  # one integer call per width
    groups = m[0].sample_groups
    assert [(p.forward.lhs.bits, p.forward.rhs.bits) for _, p in groups] == [(4, 4), (8, 8)]
    assert groups[0][0].tolist() == list(range(0, len(x), 2))
    assert groups[1][0].tolist() == list(range(1, len(x), 2))
    with torch.no_grad():
        for (rows, _), b in zip(groups, (4, 8)):
            assert torch.equal(y[rows], fixed[b].eval()(x[rows]))
        want = ref(x)
    sq = [sqnr_db(want[i], y[i]) for i in range(len(x))]
    sq4, sq8 = max(sq[0::2]), min(sq[1::2])
    assert sq8 > 30 and sq8 - sq4 > 15, (sq4, sq8)
    dfq.detach()
    assert m[0].sample_groups is None


def _training_inputs() -> torch.Tensor:
    torch.manual_seed(3)
    x = torch.randn(12, 64)
    x[:, 0] = torch.tensor([1.0, -1.0, -1.0] * 4)  # 4 samples -> 4-bit, 8 samples -> 8-bit
    return x


def test_training_pass_one_backward_at_the_shared_gradient_precision() -> None:
    """Training, two widths whose backward GEMMs share one precision (DFQ's widths set the forward GEMM only):
    two forward GEMMs (one per width) and ONE input-gradient and ONE weight-gradient GEMM for the batch; the
    gradients are bit-identical to the plain layer's at the main (largest) group's precision; the 4-bit rows
    equal a 4-bit layer's output on them.  The gates get a gradient, the controller logs the per-layer
    distribution, and BitOPs count each sample at its own width."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 48))
    inttrain.prepare_(m, "int8")
    plain = copy.deepcopy(m)
    low = copy.deepcopy(m)
    PrecisionScheduler(low, Constant(4, 8))
    dfq = attach_dfq(m, DFQConfig(bits=(4, 8), target_cost=0.5, cost_weight=0.0))
    _force_by_sign(m[0])
    x = _training_inputs().requires_grad_(True)
    counter = BitOpsCounter(m).attach()
    reset_kernel_calls()
    y = m(x)
    assert int_kernel_calls()["int8_mm"] == 2
    y.square().sum().backward()
    assert int_kernel_calls()["int8_mm"] == 4
    with torch.no_grad():
        yp = copy.deepcopy(plain)(x)  # the plain 8-bit layer on the whole batch
    rows4 = torch.arange(0, 12, 3)
    with torch.no_grad():
        assert torch.equal(y[rows4], low(x[rows4]))
        rows8 = torch.tensor([i for i in range(12) if i % 3])
        assert torch.equal(y[rows8], yp[rows8])
    # The plain 8-bit layer's backward with the same output gradient (2y) and seeds (same call count).
    m2 = copy.deepcopy(plain)
    xq = x.detach().clone().requires_grad_(True)
    m2(xq).backward(2 * y.detach())
    assert torch.equal(x.grad, xq.grad) and torch.equal(m[0].weight.grad, m2[0].weight.grad)
    assert dfq.bit_distribution() == {"0": {4: 0.333333, 8: 0.666667}}
    assert dfq.last_bits == {"0": pytest.approx(20 / 3)}
    assert float(m[0].dfq_gate.fc.weight.grad.abs().sum()) > 0
    macs = 12 * 64 * 48
    fwd = counter.records[("0", "forward")]
    assert fwd.macs == macs and fwd.bitops == macs // 3 * 16 + 2 * macs // 3 * 64
    gw = counter.records[("0", "grad_weight")]
    assert gw.macs == macs and gw.bitops == macs * 64  # gradient GEMMs: 8 x 8 for every sample


def test_per_group_backward_when_gradient_precisions_differ() -> None:
    """Groups with different backward precisions (set directly on the layer): one forward and one
    input-gradient and one weight-gradient GEMM per group; the weight gradient is the sum of the groups' own."""
    from inttrain.nn.per_sample import shares_backward
    from inttrain.schedules import with_bits

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 48))
    # nearest rounding throughout: each group's reference run must round exactly as its group does
    inttrain.prepare_(m, Int8MixedConfig(weight_grad_rounding=None))
    ref = copy.deepcopy(m)
    base = m[0].precision
    rows = (torch.tensor([0, 3, 5]), torch.tensor([1, 2, 4, 6, 7]))
    precs = (with_bits(base, 8, 6), with_bits(base, 8, 8))
    m[0].sample_groups = list(zip(rows, precs))
    assert not shares_backward(m[0].sample_groups)
    x = torch.randn(8, 64).requires_grad_(True)
    reset_kernel_calls()
    y = m(x)
    dy = torch.randn(8, 48)
    y.backward(dy)
    assert int_kernel_calls()["int8_mm"] == 6
    dw = torch.zeros_like(m[0].weight)
    for idx, prec in zip(rows, precs):
        r = copy.deepcopy(ref)
        r[0].precision = prec
        xg = x.detach()[idx].requires_grad_(True)
        yg = r(xg)
        assert torch.equal(y.detach()[idx], yg.detach())
        yg.backward(dy[idx])
        assert torch.equal(x.grad[idx], xg.grad)
        dw += r[0].weight.grad
    torch.testing.assert_close(m[0].weight.grad, dw, rtol=1e-6, atol=1e-6)


def test_expected_cost_is_the_mean_over_samples() -> None:
    """Two samples with different gate probabilities: E = mean_n softmax(z_n) . c (one layer, so no MAC weights)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 3))
    inttrain.prepare_(m, "int8")
    dfq = attach_dfq(m, DFQConfig(bits=(4, 6, 8), target_cost=0.5))
    with torch.no_grad():
        m[0].dfq_gate.fc.weight.zero_()
        m[0].dfq_gate.fc.weight[:, 0] = torch.tensor([1.0, 0.0, -1.0])
        m[0].dfq_gate.fc.bias.zero_()
    x = torch.tensor([[2.0, 0, 0, 0], [-1.0, 0, 0, 0]])
    m(x).sum().backward()
    c = torch.tensor([16, 36, 64]) / 64
    p = torch.softmax(torch.tensor([[2.0, 0, -2.0], [-1.0, 0, 1.0]]), -1)
    assert dfq.expected_cost == pytest.approx(float((p * c).sum(-1).mean()))


def test_batch_level_mode_is_kept() -> None:
    """per_sample=False: one width for the whole batch (no sample groups) and batch-pooled gate features."""
    m = nn.Sequential(nn.Linear(64, 48))
    inttrain.prepare_(m, "int8")
    dfq = attach_dfq(m, DFQConfig(bits=(4, 8), per_sample=False))
    _force_by_sign(m[0])
    x = _inputs_linear()
    x[0, 0] = 100.0  # the batch mean of channel 0 is positive: all rows at 4 bits
    m(x).sum().backward()
    assert m[0].sample_groups is None
    assert m[0].precision.forward.lhs.bits == 4
    assert dfq.bit_distribution() == {"0": {4: 1.0}}
    with pytest.raises(ValueError, match="per_sample must be true or false"):
        DFQConfig(per_sample=1)  # type: ignore[arg-type]


def test_conv_training_pass_matches_its_widths() -> None:
    """The conv layer in training: two forward convolutions, one input-gradient and one weight-gradient
    convolution for the batch; the 4-bit rows equal a 4-bit layer run on them alone, the 8-bit rows the plain
    layer run on the whole batch, and the gradients the plain layer's backward with the same output gradient."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1))
    inttrain.prepare_(m, "int8")
    plain, low = copy.deepcopy(m), copy.deepcopy(m)
    PrecisionScheduler(low, Constant(4, 8))
    attach_dfq(m, DFQConfig(bits=(4, 8), cost_weight=0.0))
    _force_by_sign(m[0])
    torch.manual_seed(4)
    x = torch.randn(9, 3, 8, 8)
    x[:, 0] = torch.tensor([1.0, -1.0, -1.0] * 3).reshape(-1, 1, 1)
    x.requires_grad_(True)
    reset_kernel_calls()
    y = m(x)
    (y * y).sum().backward()
    calls = int_kernel_calls()
    assert (calls["conv_fwd"], calls["conv_dgrad"], calls["conv_wgrad"]) == (2, 1, 1)
    rows4, rows8 = torch.arange(0, 9, 3), torch.tensor([1, 2, 4, 5, 7, 8])
    xq = x.detach().clone().requires_grad_(True)
    yq = plain(xq)
    yq.backward(2 * y.detach())
    with torch.no_grad():
        assert torch.equal(y[rows4], low(x[rows4]))
        assert torch.equal(y[rows8], yq[rows8])
    assert torch.equal(x.grad, xq.grad) and torch.equal(m[0].weight.grad, plain[0].weight.grad)
