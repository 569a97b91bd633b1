"""FracTrain DFQ gates (inttrain.recipes.fractrain_dfq): the cost regulariser moves the measured BitOPs to the
target, the gate's choice is the bit width the integer kernels run, the PFQ cap, exact resume, bad options."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import inttrain
from inttrain.cost import BitOpsCounter
from inttrain.data import load_dataset
from inttrain.kernels import int_kernel_calls, reset_kernel_calls
from inttrain.models import build_model
from inttrain.recipes.fractrain_dfq import DFQConfig, attach_dfq, forward_cost_ratio
from inttrain.schedules import Steps


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    return load_dataset("digits", None, None, seed=0).train.tensors


def _cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = build_model("small-cnn", 10, 1, 8)
    inttrain.prepare_(m, "int8")
    return m


def _train(m: nn.Module, dfq, x, y, steps: int, start: int = 0, opt=None, counter=None):
    opt = opt or torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, len(x), (64,), generator=g) for _ in range(start + steps)][start:]
    for idx in batches:
        loss = F.cross_entropy(m(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        dfq.step(float(loss.detach()))
    return opt


def test_regulariser_moves_measured_cost_to_target(digits) -> None:
    """Starting near static 8-bit (measured forward BitOPs ratio > 0.7 over the first 5 steps), 45 steps
    with target 0.4 bring the *measured* ratio of steps 30-45 (bits the int8 kernels ran, BitOpsCounter)
    within 0.1 of the target, and the model still learns (final loss < 0.5)."""
    x, y = digits
    m = _cnn()
    dfq = attach_dfq(m, DFQConfig(target_cost=0.4, cost_weight=5.0))
    counter = BitOpsCounter(m).attach()
    opt = _train(m, dfq, x, y, 5)
    first = forward_cost_ratio(counter)
    _train(m, dfq, x, y, 25, start=5, opt=opt)
    counter.reset()
    _train(m, dfq, x, y, 15, start=30, opt=opt)
    last = forward_cost_ratio(counter)
    assert first > 0.7
    assert abs(last - 0.4) < 0.1, (first, last)
    assert abs(dfq.expected_cost - 0.4) < 0.1
    m.eval()
    with torch.no_grad():
        assert F.cross_entropy(m(x[:256]), y[:256]) < 0.5


def test_without_regulariser_cost_stays_high(digits) -> None:
    """Control: cost_weight=0 keeps the gates near their 8-bit start (measured ratio > 0.7)."""
    x, y = digits
    m = _cnn()
    dfq = attach_dfq(m, DFQConfig(target_cost=0.4, cost_weight=0.0))
    counter = BitOpsCounter(m).attach()
    _train(m, dfq, x, y, 20)
    assert forward_cost_ratio(counter) > 0.7


def test_choice_sets_the_bits_the_integer_kernels_run() -> None:
    m = _cnn()
    dfq = attach_dfq(m, DFQConfig(bits=(4, 6, 8)))
    x = torch.randn(16, 1, 8, 8)
    names = [n for n, _ in dfq.layers]
    with torch.no_grad():
        m.eval()
        y8 = m(x)  # eval: argmax, the 8-bit option (init_logit)
        for _, layer in dfq.layers:
            layer.dfq_gate.fc.bias.copy_(torch.tensor([30.0, 0.0, 0.0]))
        reset_kernel_calls()
        counter = BitOpsCounter(m, training_only=False).attach()
        y4 = m(x)
    assert {layer.precision.forward.lhs.bits for _, layer in dfq.layers} == {4}
    assert {layer.precision.forward.rhs.bits for _, layer in dfq.layers} == {4}
    assert {layer.precision.grad_input.lhs.bits for _, layer in dfq.layers} == {8}
    assert {counter.records[(n, "forward")].last_bits for n in names} == {(4, 4)}
    calls = int_kernel_calls()
    assert calls.get("conv_fwd", 0) == 2 and calls.get("int8_mm", 0) == 1  # still the int8 kernels
    assert not torch.equal(y4, y8)
    # Training mode: the sampled choice is applied per layer and recorded.
    m.train()
    m(x).sum().backward()
    assert set(dfq.last_bits.values()) == {4}
    assert dfq.bits == (4.0, 8)


def test_regulariser_gradient_matches_formula() -> None:
    """One gated Linear, task gradient zero: the gate bias gradient is d/dz of w (E - t)^2 with
    E = softmax(z) . c, c_k = b_k^2 / 64, i.e. 2 w (E - t) p_j (c_j - E)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 4))
    inttrain.prepare_(m, "int8")
    cfg = DFQConfig(bits=(4, 6, 8), target_cost=0.3, cost_weight=2.0)
    dfq = attach_dfq(m, cfg)
    with torch.no_grad():
        m[0].dfq_gate.fc.bias.copy_(torch.tensor([0.3, -0.2, 1.0]))
    (0 * m(torch.randn(5, 8)).sum()).backward()
    z = torch.tensor([0.3, -0.2, 1.0])
    p = torch.softmax(z, 0)
    c = torch.tensor([16, 36, 64]) / 64
    e = float((p * c).sum())
    expected = 2 * 2.0 * (e - 0.3) * p * (c - e)
    torch.testing.assert_close(m[0].dfq_gate.fc.bias.grad, expected)
    assert dfq.expected_cost == pytest.approx(e)


def test_cap_schedule_limits_bits_and_sets_grad_bits() -> None:
    """FracTrain = PFQ + DFQ: the temporal schedule's forward bits cap every option, its gradient bits apply."""
    m = _cnn()
    dfq = attach_dfq(m, DFQConfig(bits=(4, 6, 8)), cap=Steps([(0, (3, 6)), (2, (8, 8))]))
    x = torch.randn(8, 1, 8, 8)
    for step in range(3):
        m(x).sum().backward()
        bits = {(l.precision.forward.lhs.bits, l.precision.grad_weight.lhs.bits) for _, l in dfq.layers}
        if step < 2:
            assert bits == {(3, 6)}
        else:
            assert bits <= {(4, 8), (6, 8), (8, 8)}
        dfq.step(1.0)


@pytest.mark.parametrize("per_sample", [True, False])
def test_state_dict_resume_is_exact(digits, per_sample: bool) -> None:
    """Snapshot after 10 steps (model incl. gates, optimizer, controller with its cap schedule, the layers'
    stochastic-rounding call counters, as a checkpoint holds them); a fresh model loading it and training
    10 more steps ends bit-identical to the uninterrupted run (weights, gates and controller state).
    Per sample: the resumed steps really split batches by width (some layer ran two or more widths)."""
    from inttrain.trainer.rng import layer_calls, set_layer_calls

    x, y = digits
    cap = lambda: Steps([(0, (4, 8)), (12, (8, 8))])  # noqa: E731
    a = _cnn()
    da = attach_dfq(a, DFQConfig(target_cost=0.4, per_sample=per_sample), cap=cap())
    opt_a = _train(a, da, x, y, 10)
    snap = copy.deepcopy((a.state_dict(), opt_a.state_dict(), da.state_dict(), layer_calls(a)))
    assert any(k.endswith("dfq_gate.fc.weight") for k in snap[0])
    _train(a, da, x, y, 10, start=10, opt=opt_a)
    mixed = max(len(c) for c in da.last_counts.values())
    assert mixed >= 2 if per_sample else mixed == 1

    b = _cnn(seed=5)  # another init: everything must come from the snapshot
    db = attach_dfq(b, DFQConfig(target_cost=0.4, per_sample=per_sample), cap=cap())
    opt_b = torch.optim.SGD(b.parameters(), lr=0.05, momentum=0.9)
    b.load_state_dict(snap[0])
    opt_b.load_state_dict(snap[1])
    db.load_state_dict(snap[2])
    set_layer_calls(b, snap[3])
    _train(b, db, x, y, 10, start=10, opt=opt_b)
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k
    assert da.state_dict() == db.state_dict()


@pytest.mark.parametrize("kwargs, match", [
    (dict(bits=(4,)), "at least two distinct"),
    (dict(bits=(4, 4, 8)), "at least two distinct"),
    (dict(bits=(1, 8)), r"in \[2, 8\]"),
    (dict(bits=(4, 12)), r"in \[2, 8\]"),
    (dict(bits=(4, 8), target_cost=0.1), r"target_cost must be in \[0.2500, 1\]"),
    (dict(target_cost=1.5), "target_cost"),
    (dict(cost_weight=-1.0), "cost_weight"),
    (dict(tau=0.0), "tau"),
    (dict(grad_bits=1), "grad_bits"),
    (dict(init_logit=float("inf")), "init_logit"),
])
def test_bad_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DFQConfig(**kwargs)


def test_needs_integer_layers() -> None:
    with pytest.raises(ValueError, match="prepared integer layers"):
        attach_dfq(nn.Sequential(nn.Linear(4, 2)))


def test_gated_forward_equals_the_same_bits_without_gates() -> None:
    """The straight-through factor is exactly 1.0: a training forward with every gate forced to 4 bits gives
    the same output, bit for bit, as the same model run at 4 bits by a plain schedule; and the task loss
    alone (cost_weight=0) reaches the gates."""
    from inttrain.schedules import Constant, PrecisionScheduler

    x = torch.randn(16, 1, 8, 8)
    plain = _cnn()
    gated = copy.deepcopy(plain)
    PrecisionScheduler(plain, Constant(4, 8))
    dfq = attach_dfq(gated, DFQConfig(bits=(4, 8), cost_weight=0.0))
    with torch.no_grad():
        for _, layer in dfq.layers:
            layer.dfq_gate.fc.bias.copy_(torch.tensor([30.0, 0.0]))
    out = gated(x)
    assert torch.equal(out, plain(x))
    F.cross_entropy(out, torch.arange(16) % 10).backward()
    assert all(layer.dfq_gate.fc.bias.grad is not None for _, layer in dfq.layers)
    assert any(float(layer.dfq_gate.fc.weight.grad.abs().sum()) > 0 for _, layer in dfq.layers)
