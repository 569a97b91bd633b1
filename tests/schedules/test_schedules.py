"""Precision schedules: formulas against hand-computed values, exact resume, and effect on layers."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import inttrain
from inttrain.schedules import CPT, PFQ, Constant, PrecisionScheduler, Steps, cpt_bits, precision_range_test, with_bits
from inttrain.spec import LayerPrecision


def test_constant_and_steps() -> None:
    assert Constant(4, 8).bits_at(0) == Constant(4, 8).bits_at(10**6) == (4, 8)
    s = Steps([(0, (4, 8)), (100, 6), (200, (8, 8))])
    assert [s.bits_at(t) for t in (0, 99, 100, 199, 200, 5000)] == [(4, 8), (4, 8), (6, 6), (6, 6), (8, 8), (8, 8)]
    assert Steps([(10, 5)]).bits_at(0) == (5, 5)  # before the first milestone: its bits
    with pytest.raises(ValueError):
        Steps([(10, 4), (5, 8)])
    with pytest.raises(ValueError):
        Constant(1, 8)


def test_cpt_formula_hand_values() -> None:
    # b_min=3, b_max=8, 2 cycles over 20 steps: T_c = 10.
    # t=1: 3 + 2.5 (1 - cos(0.1 pi)) = 3.122 -> 4; t=5: 3 + 2.5 = 5.5 -> 6; t=9: 3 + 2.5 * 1.951 = 7.878 -> 8.
    c = CPT(b_min=3, b_max=8, cycles=2, total_steps=20, grad_bits=8)
    assert [c.bits_at(t)[0] for t in (0, 1, 5, 9, 10, 11, 15, 19)] == [3, 4, 6, 8, 3, 4, 6, 8]
    assert {c.bits_at(t)[1] for t in range(20)} == {8}
    # b_min=2, b_max=6, 1 cycle of 4: t=1: 2 + 2 (1 - cos(pi/4)) = 2.586 -> 3; t=2: exactly 4 (no float bump);
    # t=3: 2 + 2 * 1.7071 = 5.414 -> 6.
    assert [cpt_bits(t, 2, 6, 1, 4) for t in range(5)] == [2, 3, 4, 6, 2]
    # Gradient bits cycling in phase.
    g = CPT(b_min=3, b_max=8, cycles=2, total_steps=20, grad_bits=8, grad_min=6)
    assert [g.bits_at(t) for t in (0, 5, 9)] == [(3, 6), (6, 7), (8, 8)]


def test_pfq_stages_and_resume() -> None:
    losses = [2.0] * 4 + [1.0] * 4 + [0.99] * 4 + [0.985] * 4 + [0.98] * 40
    p = PFQ(threshold=0.05, decay=0.5, window=4, min_windows=1)
    bits = []
    for t, loss in enumerate(losses):
        bits.append(p.bits_at(t))
        p.observe(t, loss)
    # windows: 2.0 | 1.0 (d=0.5, no) | 0.99 (d=0.01 < 0.05: -> stage 1 at step 11, thr 0.025)
    # | 0.985 (first window of stage 1: reference) | 0.98 (d=0.0051 < 0.025: -> stage 2 at step 19) ...
    assert p.switch_steps[:2] == [11, 19]
    assert bits[11] == (3, 6) and bits[12] == (4, 6) and bits[20] == (6, 8)
    assert p.bits_at(10**6) == (8, 8) and p.stage == 3
    # Resume from the state in the middle reproduces the rest exactly.
    q = PFQ(threshold=0.05, decay=0.5, window=4, min_windows=1)
    for t, loss in enumerate(losses[:14]):
        q.observe(t, loss)
    r = PFQ(threshold=0.05, decay=0.5, window=4, min_windows=1)
    r.load_state_dict(copy.deepcopy(q.state_dict()))
    for t, loss in enumerate(losses[14:], start=14):
        r.observe(t, loss)
    assert r.state_dict() == p.state_dict()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    inttrain.prepare_(m, "int8")
    return m


def test_with_bits_touches_the_right_operands() -> None:
    p = with_bits(LayerPrecision(), 4, 6)
    assert (p.forward.lhs.bits, p.forward.rhs.bits) == (4, 4)
    assert (p.grad_input.lhs.bits, p.grad_weight.lhs.bits) == (6, 6)
    assert (p.grad_input.rhs.bits, p.grad_weight.rhs.bits) == (4, 4)  # the forward's W and x, read again
    assert p.forward.lhs.granularity == LayerPrecision().forward.lhs.granularity


def test_scheduler_sets_layers_and_resumes_exactly() -> None:
    m = _mlp()
    sched = PrecisionScheduler(m, CPT(3, 8, 2, 20))
    layers = [l for l in m.modules() if hasattr(l, "precision")]
    assert len(layers) == 2 and all(l.precision.forward.lhs.bits == 3 for l in layers)
    seen = [sched.step(loss=1.0) for _ in range(5)]
    assert seen == [(4, 8), (4, 8), (5, 8), (5, 8), (6, 8)]
    assert all(l.precision.forward.rhs.bits == 6 and l.precision.grad_input.lhs.bits == 8 for l in layers)
    state = copy.deepcopy(sched.state_dict())
    m2 = _mlp()
    s2 = PrecisionScheduler(m2, CPT(3, 8, 2, 20))
    s2.load_state_dict(state)
    assert [l.precision for l in m2.modules() if hasattr(l, "precision")] == [l.precision for l in layers]
    assert [s2.step() for _ in range(10)] == [sched.step() for _ in range(10)]


def test_evaluation_bits_and_restore() -> None:
    """CPT validates at the top of its cycle, whatever step it is at; the step's bits come back after."""
    m = _mlp()
    layers = [l for l in m.modules() if hasattr(l, "precision")]
    sched = PrecisionScheduler(m, CPT(3, 8, 2, 20))
    for _ in range(10):  # step 10 starts the second cycle: B_min
        sched.step(loss=1.0)
    assert sched.bits == (3, 8)
    with sched.evaluation() as bits:
        assert bits == (8, 8) and all(l.precision.forward.lhs.bits == 8 for l in layers)
    assert all(l.precision.forward.lhs.bits == 3 for l in layers)
    assert CPT(3, 8, 2, 20, grad_bits=6, grad_min=4).eval_bits(10) == (8, 6)
    assert Steps([(0, 4), (5, (6, 8))]).eval_bits(7) == (6, 8)  # other schedules: the step's own bits


def _sqnr(ref: torch.Tensor, y: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - y).pow(2).sum()))


def test_bits_change_what_layers_compute() -> None:
    torch.manual_seed(1)
    lin = nn.Linear(64, 32)
    conv = nn.Conv2d(3, 8, 3, padding=1)
    x, xc = torch.randn(16, 64), torch.randn(2, 3, 8, 8)
    ref, refc = lin(x).detach(), conv(xc).detach()
    model = nn.ModuleDict({"lin": lin, "conv": conv})
    inttrain.prepare_(model, "int8")
    sched = PrecisionScheduler(model, Steps([(0, 8), (1, 4)]))
    with torch.no_grad():
        y8, y8c = lin(x), conv(xc)
        sched.step()
        y4, y4c = lin(x), conv(xc)
    assert not torch.equal(y8, y4) and not torch.equal(y8c, y4c)
    assert _sqnr(ref, y4) < _sqnr(ref, y8) - 10  # ~6 dB per bit
    assert _sqnr(refc, y4c) < _sqnr(refc, y8c) - 10


def test_gradient_bits_change_the_backward() -> None:
    m = _mlp()
    x = torch.randn(8, 16)

    def grads(bits: tuple[int, int]) -> torch.Tensor:
        PrecisionScheduler(m, Constant(*bits))
        m.zero_grad()
        m(x).square().sum().backward()
        return m[0].weight.grad.clone()

    g88, g84 = grads((8, 8)), grads((8, 4))
    assert not torch.equal(g88, g84)


def test_conv_takes_up_to_16_bits() -> None:
    # Convolutions split 9..16-bit codes into exact int8 halves as Linear layers do (tests/kernels/test_conv_int16.py).
    model = nn.Sequential(nn.Conv2d(1, 2, 3))
    inttrain.prepare_(model, "int8")
    PrecisionScheduler(model, Constant(12, 8))
    assert model[0].precision.forward.lhs.bits == model[0].precision.forward.rhs.bits == 12
    with pytest.raises(ValueError):
        Constant(17, 8)


def test_precision_range_test_finds_planted_threshold() -> None:
    curve = {2: 0.10, 3: 0.12, 4: 0.15, 5: 0.62, 6: 0.80, 7: 0.85, 8: 0.86}
    probed: list[int] = []

    def probe(b: int) -> float:
        probed.append(b)
        return curve[b]

    r = precision_range_test(probe, threshold=0.5)
    assert r.b_min == 5 and probed == [2, 3, 4, 5] and r.accuracies == {b: curve[b] for b in (2, 3, 4, 5)}
    assert precision_range_test(curve.__getitem__, threshold=0.3, relative=True).b_min == 5
    assert precision_range_test(curve.__getitem__, threshold=0.99).b_min is None
