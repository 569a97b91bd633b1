"""Time the paths of wide-code training: 9-bit convolutions and eager stochastic-rounding uniforms.

Usage:  python benchmarks/wide_codes.py [--threads 1] [--reps 7] [--steps 4] [--out DIR]

Three interleaved comparisons in one process (each cell the median over ``--reps`` calls, the variants of a row
alternating so a shift of the machine's speed hits both alike):

- per ResNet-20 3x3 layer (batch 128, 9-bit codes as DoReFa at k = 8 gives them: activations 0..255, odd
  weights and gradients): forward, input gradient and weight gradient on ``kernels.conv_wide`` (int8 halves on
  the native kernels) against ``kernels.conv_generic`` (im2col + int8 GEMMs, the path before), with the int8
  convolution of the same layer for reference;
- ``numerics.uniform_from_counter`` on 1M and 2M values: the eager NumPy uint32 path against the int64 lanes
  that compiled graphs run;
- a DoReFa-8 ResNet-20 training step (eager, as the recipe trains) with the conv path and the hash swapped.
Results also go to ``OUT/results.md`` with the CPU model and flags.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import inttrain  # noqa: E402
from inttrain.autograd import conv as autograd_conv  # noqa: E402
from inttrain.kernels import conv, conv_generic, conv_wide  # noqa: E402
from inttrain.kernels.conv_geometry import ConvGeometry  # noqa: E402
from inttrain.kernels.workspace import keep_freed_memory  # noqa: E402
from inttrain.models import build_model  # noqa: E402
from inttrain.numerics import hashing  # noqa: E402
from speed import cpu_flags, cpu_model  # noqa: E402  (benchmarks/speed.py: the CPU description)

LAYERS = [(16, 32), (32, 16), (64, 8)]  # (channels, input size), stride 1


def _medians(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median ms of each function, the functions called in turn ``reps`` times after one warm-up call each."""
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}


def _layer_rows(reps: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    geom = ConvGeometry((1, 1), (1, 1), (1, 1), 1)
    rows = []
    for c, hw in LAYERS:
        shape = (128, c, hw, hw)
        x = torch.randint(0, 256, shape, generator=g).to(torch.int16).contiguous(memory_format=torch.channels_last)
        dy = (2 * torch.randint(-128, 128, shape, generator=g) + 1).to(torch.int16).contiguous(
            memory_format=torch.channels_last)
        w = (2 * torch.randint(-128, 128, (c, c, 3, 3), generator=g) + 1).to(torch.int16)
        x8 = torch.randint(-128, 128, shape, generator=g, dtype=torch.int8).contiguous(memory_format=torch.channels_last)
        w8 = torch.randint(-127, 128, (c, c, 3, 3), generator=g, dtype=torch.int8)
        s1, sc = torch.tensor([0.01]), torch.rand(c, generator=g) + 0.1
        fns: dict[str, Callable[[], object]] = {}
        for name, mod in (("wide", conv_wide), ("generic", conv_generic), ("int8", conv)):
            xa, wa, ga = (x8, w8, x8) if name == "int8" else (x, w, dy)
            fns[f"{name} fwd"] = lambda m=mod, a=xa, b=wa: m.conv2d_forward(a, s1, b, sc, geom)
            fns[f"{name} dgrad"] = lambda m=mod, a=ga, b=wa: m.conv2d_input_grad(a, s1, b, sc, shape, geom)
            fns[f"{name} wgrad"] = lambda m=mod, a=ga, b=xa: m.conv2d_weight_grad(a, sc, b, s1, (c, c, 3, 3), geom)
        t = _medians(fns, reps)
        cells = " | ".join(f"{t[f'{p} fwd']:.2f} / {t[f'{p} dgrad']:.2f} / {t[f'{p} wgrad']:.2f}"
                           for p in ("generic", "wide", "int8"))
        total = {p: sum(t[f"{p} {k}"] for k in ("fwd", "dgrad", "wgrad")) for p in ("generic", "wide")}
        rows.append(f"| {c}->{c} @{hw}px | {cells} | {total['generic'] / total['wide']:.2f}x |")
    return rows


def _int64_uniforms(n: int, seed: int) -> torch.Tensor:
    return hashing._uniform_int64(n, seed)  # the int64 lanes compiled graphs run


def _hash_rows(reps: int) -> list[str]:
    rows = []
    for n in (1 << 20, 1 << 21):
        t = _medians({"numpy": lambda n=n: hashing._uniform_numpy(n, 123), "int64": lambda n=n: _int64_uniforms(n, 123)},
                     reps)
        rows.append(f"| {n:,} values | {t['int64']:.2f} | {t['numpy']:.2f} | {t['int64'] / t['numpy']:.1f}x |")
    return rows


def _dorefa_steps(steps: int) -> dict[str, float]:
    """Median seconds of a DoReFa-8 ResNet-20 step (batch 128) with each (conv path, hash) combination."""
    torch.manual_seed(0)
    base = build_model("resnet20", 10, 3, 32)
    x, y = torch.randn(128, 3, 32, 32), torch.randint(0, 10, (128,))

    def make() -> Callable[[], None]:
        m = inttrain.prepare_(copy.deepcopy(base), "dorefa")
        opt = torch.optim.SGD(m.parameters(), lr=0.01)

        def step() -> None:
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad()
        return step

    numpy_hash = hashing._uniform_numpy
    variants = {"im2col convs, int64 hash": (conv_generic, _int64_uniforms),
                "wide convs, int64 hash": (conv_wide, _int64_uniforms),
                "wide convs, NumPy hash": (conv_wide, numpy_hash)}
    fns = {}
    for name, (path, uniforms) in variants.items():
        step = make()

        def run(step=step, path=path, uniforms=uniforms) -> None:
            autograd_conv.conv_wide, hashing._uniform_numpy = path, uniforms
            step()
        fns[name] = run
    try:
        return {k: v / 1e3 for k, v in _medians(fns, steps).items()}
    finally:
        autograd_conv.conv_wide, hashing._uniform_numpy = conv_wide, numpy_hash


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/wide_codes"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    lines = [f"# Wide-code training paths ({cpu_model()}; {cpu_flags()}; {args.threads} thread(s), "
             f"torch {torch.__version__})", "",
             "9-bit convolutions, batch 128, ms (median of interleaved calls), forward / input gradient / weight gradient:",
             "", "| layer | im2col + int8 GEMMs (before) | int8 halves on the native kernels | int8 codes (reference) "
             "| speed-up |", "|---|---|---|---|---|", *_layer_rows(args.reps), "",
             "Stochastic-rounding uniforms, eager CPU, ms:", "",
             "| size | int64 lanes | NumPy uint32 chunks | speed-up |", "|---|---|---|---|", *_hash_rows(args.reps), ""]
    steps = _dorefa_steps(args.steps)
    lines += ["DoReFa-8 ResNet-20 training step (batch 128, eager), s:", "", "| variant | s per step |", "|---|---|",
              *[f"| {k} | {v:.2f} |" for k, v in steps.items()], ""]
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
