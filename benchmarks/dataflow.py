#!/usr/bin/env python
"""Int8 dataflow benchmark: activation memory and step time of a CIFAR ResNet-20 and a small GPT training step.

    python benchmarks/dataflow.py                  # ResNet-20 batch 128 and GPT (d512 L4, seq 256, batch 8)
    python benchmarks/dataflow.py --quick          # quarter batches, fewer iterations (smoke run)
    python benchmarks/dataflow.py --only resnet20  # one model
    python benchmarks/dataflow.py --out results/   # also write dataflow.md there

Variants, same initial weights and data, channels-last for all:
- fp32: eager float32;  bf16: ``torch.autocast("cpu", dtype=torch.bfloat16)`` around forward and loss;
- int8: ``inttrain.prepare_(model, "int8")`` (integer GEMMs, float activations between layers);
- int8 + dataflow: ``prepare_(model, "int8", dataflow=True)`` (int8 activations between layers).

Memory is measured, not estimated: :func:`inttrain.cost.saved_activation_bytes` sums the distinct
storages autograd saves for backward during one forward (parameters excluded).  Step time is forward +
cross-entropy + backward + SGD step, variants timed interleaved (one iteration of each in turn, so a
busy machine slows all alike), median reported.  Default allocator and thread count.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

try:
    import inttrain
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    import inttrain
from inttrain.cost import saved_activation_bytes
from inttrain.kernels import int_kernel_calls
from inttrain.models import build_model

CL = torch.channels_last
VARIANTS = ("fp32", "bf16", "int8", "int8 + dataflow")


def _build(name: str) -> nn.Module:
    if name == "resnet20":
        return build_model("resnet20", 10, 3, 32)
    return build_model("gpt-small", 65, 1, 256, d_model=512, n_layers=4, n_heads=8)


def _inputs(name: str, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if name == "resnet20":
        return (torch.randn(batch, 3, 32, 32, generator=g).contiguous(memory_format=CL),
                torch.randint(0, 10, (batch,), generator=g))
    return torch.randint(0, 65, (batch, 256), generator=g), torch.randint(0, 65, (batch, 256), generator=g)


def _model(name: str, variant: str, state: dict) -> nn.Module:
    m = _build(name)
    m.load_state_dict(state)
    if name == "resnet20":
        m = m.to(memory_format=CL)
    if variant.startswith("int8"):
        inttrain.prepare_(m, "int8", dataflow=variant.endswith("dataflow"))
    return m.train()


def _loss_fn(variant: str, m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], torch.Tensor]:
    def ce() -> torch.Tensor:
        logits = m(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def loss() -> torch.Tensor:
        if variant == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return ce()
        return ce()

    return loss


def run(name: str, batch: int, iters: int, warmup: int, variants: tuple[str, ...] = VARIANTS) -> list[dict]:
    torch.manual_seed(0)
    state = copy.deepcopy(_build(name).state_dict())
    x, y = _inputs(name, batch)
    rows = []
    steps = {}
    for v in variants:
        m = _model(name, v, state)
        loss = _loss_fn(v, m, x, y)
        nbytes = saved_activation_bytes(m, loss)
        opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)

        def step(loss=loss, opt=opt) -> None:
            loss().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(warmup):
            step()
        steps[v] = step
        rows.append({"variant": v, "saved_bytes": nbytes, "times": []})
    before = int_kernel_calls()
    for _ in range(iters):
        for row in rows:
            t0 = time.perf_counter()
            steps[row["variant"]]()
            row["times"].append(time.perf_counter() - t0)
    if int_kernel_calls() == before:
        raise RuntimeError("no integer kernel ran during the int8 timings")
    return rows


TITLES = {"resnet20": "CIFAR ResNet-20 training step", "gpt": "GPT training step (d512 L4 H8, seq 256, vocab 65)"}


def markdown(name: str, rows: list[dict], batch: int) -> str:
    base = {r["variant"]: r for r in rows}
    fp32_mem, fp32_ms = base["fp32"]["saved_bytes"], statistics.median(base["fp32"]["times"]) * 1e3
    lines = [
        f"{TITLES[name]}, batch {batch}, torch {torch.__version__}, {torch.get_num_threads()} threads",
        "",
        "| variant | saved activations (MiB) | fp32 / this (memory) | step ms (median) | fp32 / this (time) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ms = statistics.median(r["times"]) * 1e3
        mib = r["saved_bytes"] / 2**20
        lines.append(f"| {r['variant']} | {mib:.1f} | {fp32_mem / r['saved_bytes']:.2f}x | {ms:.0f} | {fp32_ms / ms:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="quarter batches, 3 timed iterations")
    ap.add_argument("--only", default="resnet20,gpt", help="comma-separated subset of resnet20,gpt")
    ap.add_argument("--iters", type=int, default=None, help="timed iterations per variant (default 10)")
    ap.add_argument("--out", type=Path, default=None, help="folder to write dataflow.md into")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated subset of the variants, fp32 included (the ratios are against it); "
                         "the test leaves bf16 out: on CPUs without bf16 instructions it is ~10x slower")
    a = ap.parse_args(argv)
    variants = tuple(v.strip() for v in a.variants.split(","))
    if "fp32" not in variants or not set(variants) <= set(VARIANTS):
        ap.error(f"--variants: a subset of {', '.join(VARIANTS)} that includes fp32, got {a.variants!r}")
    iters = a.iters or (3 if a.quick else 10)
    tables = []
    for name in a.only.split(","):
        if name not in TITLES:
            ap.error(f"--only: {name!r} is not one of {', '.join(TITLES)}")
        batch = {"resnet20": 128, "gpt": 8}[name] // (4 if a.quick else 1)
        tables.append(markdown(name, run(name, batch, iters, warmup=2 if a.quick else 3, variants=variants), batch))
        print(tables[-1], flush=True)
    table = "\n".join(tables)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "dataflow.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
