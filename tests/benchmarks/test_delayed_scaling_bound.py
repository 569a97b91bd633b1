"""benchmarks/delayed_scaling_bound.py: the fixed-range precision gives the activations and output gradients
(every GEMM's lhs) a fixed range and leaves the weights (rhs) and float GEMMs alone."""

from __future__ import annotations

from types import ModuleType

import torch

import inttrain

SCRIPT = "delayed_scaling_bound"


def test_fixed_range_sets_the_lhs_of_every_integer_gemm(bench: ModuleType) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    inttrain.prepare_(model, "int8")
    before = model[0].precision
    p = bench.fixed_range(before, amax=2.5)
    for g_before, g in ((before.forward, p.forward), (before.grad_input, p.grad_input),
                        (before.grad_weight, p.grad_weight)):
        assert g_before.lhs.fixed_amax is None and g.lhs.fixed_amax == 2.5
        assert g.rhs == g_before.rhs
