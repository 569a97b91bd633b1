"""Time the int8 conv kernels against fp32 (channels_last and NCHW) and bf16 for ResNet-20's 3x3 convs.

Usage:  python benchmarks/conv_kernels.py [--batch 128] [--reps 20] [--rounds 1]

Each cell is the minimum over ``--reps`` timed calls after warm-up, and over
``--rounds`` passes through all layers (the minimum is the most robust statistic on
a shared machine: other processes only ever add time).  Float baselines use
``aten.convolution_backward`` with an output mask, so forward, input gradient and
weight gradient are timed separately, like the int8 kernels.  "ratio" is the fp32
channels_last time divided by the int8 time (> 1: int8 is faster).  The "int8 onednn" row runs the same
kernels with the native forward / input-gradient convolution switched off (oneDNN's int8 convolution, with the
weight prepack it needs on every call), the comparison behind the native kernel (kernels/native/conv.c).
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch
import torch.nn.functional as F

from inttrain.kernels import conv as K
from inttrain.kernels import native
from inttrain.kernels.workspace import keep_freed_memory
from speed import cpu_flags, cpu_model  # benchmarks/speed.py: the same CPU description as the speed table

# (Cin, Cout, input size, stride): the 3x3 convs of a CIFAR ResNet-20.
LAYERS = [(16, 16, 32, 1), (32, 32, 16, 1), (64, 64, 8, 1), (16, 32, 32, 2), (32, 64, 16, 2)]


def _time(fn: Callable[[], object], reps: int) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def _float_fns(x: torch.Tensor, w: torch.Tensor, stride: int) -> dict[str, Callable[[], object]]:
    y = F.conv2d(x, w, stride=stride, padding=1)
    g = torch.randn_like(y)
    args = (g, x, w, None, [stride] * 2, [1, 1], [1, 1], False, [0, 0], 1)
    bwd = torch.ops.aten.convolution_backward
    return {
        "fwd": lambda: F.conv2d(x, w, stride=stride, padding=1),
        "dgrad": lambda: bwd(*args, [True, False, False]),
        "wgrad": lambda: bwd(*args, [False, True, False]),
    }


def _onednn(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` with the native convolution switched off: the int8 kernels take oneDNN's path."""

    def run() -> object:
        supported = native.conv_forward_supported
        native.conv_forward_supported = lambda *args: False
        try:
            return fn()
        finally:
            native.conv_forward_supported = supported

    return run


def _int8_fns(n: int, cin: int, cout: int, hw: int, stride: int) -> dict[str, Callable[[], object]]:
    geom = K.ConvGeometry((stride, stride), (1, 1), (1, 1), 1)
    cl = torch.channels_last
    xq = torch.randint(-127, 128, (n, cin, hw, hw), dtype=torch.int8).contiguous(memory_format=cl)
    wq = torch.randint(-127, 128, (cout, cin, 3, 3), dtype=torch.int8)
    ho = (hw - 1) // stride + 1
    gq = torch.randint(-127, 128, (n, cout, ho, ho), dtype=torch.int8).contiguous(memory_format=cl)
    xu, gu = K.to_shifted_u8(xq), K.to_shifted_u8(gq)
    s1, so, si = torch.tensor([0.02]), torch.rand(cout) + 0.5, torch.rand(cin) + 0.5
    shape_x, shape_w = tuple(xq.shape), tuple(wq.shape)
    return {
        "fwd": lambda: K.conv2d_forward(xq, s1, wq, so, geom),
        "fwd_u8": lambda: K.conv2d_forward_u8(xu, s1, wq, so, geom),
        "dgrad": lambda: K.conv2d_input_grad(gq, s1, wq, si, shape_x, geom),
        "dgrad_u8": lambda: K.conv2d_input_grad_u8(gu, s1, wq, si, shape_x, geom),
        "wgrad": lambda: K.conv2d_weight_grad(gq, so, xq, s1, shape_w, geom),
    }


def _row(label: str, times: dict[str, float]) -> str:
    total = times["fwd"] + times["dgrad"] + times["wgrad"]
    cells = " ".join(f"{times[k]:8.2f}" for k in ("fwd", "dgrad", "wgrad"))
    return f"  {label:<14}{cells} {total:8.2f}"


def measure_layer(n: int, cin: int, cout: int, hw: int, stride: int, reps: int) -> dict[str, dict[str, float]]:
    torch.manual_seed(0)
    w = torch.randn(cout, cin, 3, 3)
    x = torch.randn(n, cin, hw, hw)
    rows = {
        "fp32 cl": _float_fns(x.contiguous(memory_format=torch.channels_last), w, stride),
        "fp32 nchw": _float_fns(x, w, stride),
        "bf16 cl": _float_fns(x.bfloat16().contiguous(memory_format=torch.channels_last), w.bfloat16(), stride),
        "int8": _int8_fns(n, cin, cout, hw, stride),
    }
    rows["int8 onednn"] = {k: _onednn(f) for k, f in rows["int8"].items()}
    return {name: {k: _time(f, reps) for k, f in fns.items()} for name, fns in rows.items()}


def print_layer(cin: int, cout: int, hw: int, stride: int, n: int, results: dict[str, dict[str, float]]) -> None:
    print(f"\n{cin}->{cout} @{hw}px stride {stride}, batch {n}   (ms)     fwd    dgrad    wgrad    total")
    for name, t in results.items():
        print(_row(name, t))
    int8 = results["int8"]
    print(_row("int8 (u8 in)", {"fwd": int8["fwd_u8"], "dgrad": int8["dgrad_u8"], "wgrad": int8["wgrad"]}))
    ref = results["fp32 cl"]
    ratio = {k: ref[k] / int8[k] for k in ("fwd", "dgrad", "wgrad")}
    total_ratio = sum(ref[k] for k in ratio) / sum(int8[k] for k in ratio)
    print("  ratio fp32cl/int8 " + " ".join(f"{ratio[k]:7.2f}x" for k in ratio) + f" {total_ratio:7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    keep_freed_memory()  # as benchmarks/speed.py and the CLI do: no page faults on fresh outputs
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu_model()} ({cpu_flags()})")
    best: dict[tuple, dict[str, dict[str, float]]] = {}
    for _ in range(args.rounds):
        for layer in LAYERS:
            res = measure_layer(args.batch, *layer, args.reps)
            old = best.setdefault(layer, res)
            for name, cells in res.items():
                for k, v in cells.items():
                    old[name][k] = min(old[name][k], v)
    for (cin, cout, hw, stride), res in best.items():
        print_layer(cin, cout, hw, stride, args.batch, res)


if __name__ == "__main__":
    main()
