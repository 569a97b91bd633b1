"""Per-sample DFQ (issue 19): each sample's gate picks its own bits; the layer runs one integer call per width
present, and every sample's output carries the error of its own width."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import inttrain
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


def test_training_pass_runs_both_backward_gemms_per_width() -> None:
    """Training (straight-through Gumbel per sample): two widths -> two forward GEMMs and, in backward, an
    input-gradient and a weight-gradient GEMM per width (the input needs a gradient); the weight gradient
    is the sum over the groups of the groups' own int8 weight gradients; the gates get a gradient; the
    controller logs the per-layer distribution, and BitOPs count each sample at its own width."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 48))
    inttrain.prepare_(m, "int8")
    dfq = attach_dfq(m, DFQConfig(bits=(4, 8), target_cost=0.5, cost_weight=0.0))
    _force_by_sign(m[0])
    x = _inputs_linear().requires_grad_(True)
    counter = BitOpsCounter(m).attach()
    reset_kernel_calls()
    y = m(x)
    assert int_kernel_calls()["int8_mm"] == 2
    y.square().sum().backward()
    assert int_kernel_calls()["int8_mm"] == 6
    assert dfq.bit_distribution() == {"0": {4: 0.5, 8: 0.5}}
    assert dfq.last_bits == {"0": 6.0} and dfq.bits == (6.0, 8)
    assert float(m[0].dfq_gate.fc.weight.grad.abs().sum()) > 0
    macs = 12 * 64 * 48
    fwd = counter.records[("0", "forward")]
    assert fwd.macs == macs and fwd.bitops == macs // 2 * 16 + macs // 2 * 64
    gw = counter.records[("0", "grad_weight")]
    assert gw.macs == macs and gw.bitops == macs // 2 * (8 * 8) * 2  # gradient GEMMs: grad_bits 8 for both widths


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
