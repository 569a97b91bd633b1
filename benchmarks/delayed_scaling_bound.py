"""The most delayed scaling could save: a compiled int8 ResNet-20 step with and without its amax reductions.

Usage:  python benchmarks/delayed_scaling_bound.py [--threads 1] [--rounds 12] [--batch 128]

Delayed scaling (scales from an amax history, as Transformer Engine does for fp8) lets a quantizer's codes be
written without first reducing the tensor's amax.  Its best case is a quantizer whose range is simply given:
here every activation and gradient quantizer (the lhs of the forward, input-gradient and weight-gradient
convolutions) gets ``QuantSpec.fixed_amax``, so the compiled graph reduces no amax at all -- delayed scaling
would still reduce one for its history, so the gain it could bring is at most what this shows.  The two
compiled steps run interleaved in one process (``--rounds`` rounds), and the script prints each one's minimum
and median step time and their ratio (< 1: the fixed-range step is faster).  The fixed ranges make the
numbers meaningless as training: this times the graph, nothing else.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Callable

import torch
import torch.nn.functional as F

import inttrain
from inttrain.kernels.workspace import keep_freed_memory
from inttrain.models import build_model
from inttrain.spec import GemmPrecision, LayerPrecision


def fixed_range(p: LayerPrecision, amax: float = 4.0) -> LayerPrecision:
    """``p`` with its three GEMMs' lhs (activations, output gradients) on a fixed range instead of the amax."""

    def fixed(g: GemmPrecision) -> GemmPrecision:
        return dataclasses.replace(g, lhs=dataclasses.replace(g.lhs, fixed_amax=amax)) if g.integer else g

    return dataclasses.replace(p, forward=fixed(p.forward), grad_input=fixed(p.grad_input),
                               grad_weight=fixed(p.grad_weight))


def compiled_step(batch: int, fixed: bool) -> Callable[[], None]:
    """One compiled training step of an int8 ResNet-20 on fixed random data (warmed up: compiled)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 32, 32, generator=gen).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), generator=gen)
    torch.manual_seed(0)
    model = build_model("resnet20", 10, 3, 32).to(memory_format=torch.channels_last)
    inttrain.prepare_(model, "int8")
    if fixed:
        for layer in model.modules():
            if isinstance(getattr(layer, "precision", None), LayerPrecision):
                layer.precision = fixed_range(layer.precision)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    run = torch.compile(model)

    def step() -> None:
        F.cross_entropy(run(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()
    for name in ("threads", "rounds", "batch"):  # judged before anything is built or compiled
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    from speed import cpu_flags, cpu_model  # benchmarks/speed.py (run as a script): the speed table's CPU line

    torch.set_num_threads(args.threads)
    keep_freed_memory()
    print(f"CPU: {cpu_model()} ({cpu_flags()}), {args.threads} thread(s), torch {torch.__version__}")
    steps = {"amax (just in time)": compiled_step(args.batch, False), "fixed range": compiled_step(args.batch, True)}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    medians = {}
    for name, ts in times.items():
        ts.sort()
        medians[name] = ts[len(ts) // 2]
        print(f"{name:20s} min {ts[0] * 1e3:7.1f} ms  median {medians[name] * 1e3:7.1f} ms")
    print(f"fixed range / amax: {medians['fixed range'] / medians['amax (just in time)']:.3f} (median)")


if __name__ == "__main__":
    main()
